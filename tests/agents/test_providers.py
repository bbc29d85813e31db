"""The OpenAI-compatible provider, against the local fake server through the real `openai` client:
what it sends, what it reads back, and how each failure is classed for the fallback chain."""

import pytest

from agents.providers import OpenAICompatibleProvider, ProviderError
from tests.agents.fake_llm import MALFORMED, NOT_JSON, RATE_LIMIT, SERVER_ERROR, FakeLLM, Reply, say, tool_call

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Add the endpoint."}]
TOOLS = [{"type": "function", "function": {"name": "finish", "parameters": {"type": "object", "properties": {}}}}]


@pytest.fixture
def provider(fake_llm: FakeLLM, monkeypatch: pytest.MonkeyPatch) -> OpenAICompatibleProvider:
    monkeypatch.setenv("OPENAI_BASE_URL", fake_llm.url)
    monkeypatch.setenv("OPENAI_TIMEOUT_S", "5")
    return OpenAICompatibleProvider("default")


def test_a_completion_brings_its_text_tool_calls_and_usage(
    provider: OpenAICompatibleProvider, fake_llm: FakeLLM
) -> None:
    fake_llm.script("m", say("On it.", tool_call("finish", {"result": "done"}, "c1")))

    completion = provider.complete(model="m", messages=MESSAGES, tools=TOOLS)

    assert (completion.model, completion.content) == ("m", "On it.")
    assert completion.tool_calls == [{"id": "c1", "name": "finish", "arguments": '{"result": "done"}'}]
    assert (completion.prompt_tokens, completion.completion_tokens) == (11, 7)  # the fake's usage
    (sent,) = fake_llm.calls_for("m")
    assert sent == {"model": "m", "messages": MESSAGES, "tools": TOOLS}


def test_no_tools_key_is_sent_without_tools_and_a_message_without_text_reads_as_empty(
    provider: OpenAICompatibleProvider, fake_llm: FakeLLM
) -> None:
    fake_llm.script("m", say("", tool_call("finish", {}, "c1")))

    completion = provider.complete(model="m", messages=MESSAGES, tools=[])

    assert completion.content == "" and [c["name"] for c in completion.tool_calls] == ["finish"]
    assert "tools" not in fake_llm.calls_for("m")[0]


@pytest.mark.parametrize(
    ("reply", "error_class", "retryable"),
    [
        (SERVER_ERROR, "InternalServerError", True),
        (RATE_LIMIT, "RateLimitError", True),
        (MALFORMED, "MalformedResponse", True),  # JSON, not a chat completion
        (NOT_JSON, "MalformedResponse", True),
        ({"role": "assistant", "content": ["not", "text"]}, "MalformedResponse", True),
    ],
)
def test_each_failure_is_classed_for_the_fallback_chain(
    provider: OpenAICompatibleProvider, fake_llm: FakeLLM, reply: Reply, error_class: str, retryable: bool
) -> None:
    fake_llm.script("m", reply)

    with pytest.raises(ProviderError) as failed:
        provider.complete(model="m", messages=MESSAGES, tools=TOOLS)

    assert (failed.value.error_class, failed.value.retryable) == (error_class, retryable)


def test_an_unreachable_endpoint_is_a_retryable_connection_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")  # the discard port: nothing listens
    with pytest.raises(ProviderError) as failed:
        OpenAICompatibleProvider("default").complete(model="m", messages=MESSAGES, tools=[])

    assert (failed.value.error_class, failed.value.retryable) == ("APIConnectionError", True)
