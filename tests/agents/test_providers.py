"""The OpenAI-compatible provider, against the local fake server through the real `openai` client:
what it sends, what it reads back, and how each failure is classed for the fallback chain."""

from collections.abc import Iterator
from typing import Any

import httpcore2
import pytest
from celery.signals import worker_init

from agents import providers
from agents.providers import OpenAICompatibleProvider, ProviderError
from tests.agents.fake_llm import HANG, MALFORMED, NOT_JSON, RATE_LIMIT, SERVER_ERROR, FakeLLM, Reply, say, tool_call

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


def call_with(*, id: Any = "c1", name: Any = "finish", arguments: Any = "{}") -> Reply:
    """A completion with one tool call whose fields are as given (a name that is not text, say)."""
    call = {"id": id, "type": "function", "function": {"name": name, "arguments": arguments}}
    return {"role": "assistant", "content": "", "tool_calls": [call]}


ODD_USAGE: list[dict[str, Any]] = [
    {"prompt_tokens": float("inf")},
    {"prompt_tokens": -50},
    {"completion_tokens": 3_000_000_000},
    {"prompt_tokens": "12"},
    {"prompt_tokens": 1.5},
]
ODD_CALLS: list[dict[str, Any]] = [{"name": None}, {"name": 7}, {"id": 7}, {"arguments": ["a"]}]


def test_arguments_sent_as_an_object_read_as_their_json(provider: OpenAICompatibleProvider, fake_llm: FakeLLM) -> None:
    fake_llm.script("m", call_with(arguments={"result": "done"}))

    completion = provider.complete(model="m", messages=MESSAGES, tools=TOOLS)

    assert completion.tool_calls == [{"id": "c1", "name": "finish", "arguments": '{"result": "done"}'}]


@pytest.mark.parametrize(
    ("reply", "error_class", "retryable"),
    [
        (SERVER_ERROR, "InternalServerError", True),
        (RATE_LIMIT, "RateLimitError", True),
        (MALFORMED, "MalformedResponse", True),  # JSON, not a chat completion
        (NOT_JSON, "MalformedResponse", True),
        ({"role": "assistant", "content": ["not", "text"]}, "MalformedResponse", True),
        # a tool call whose name, id or arguments are not text
        *((call_with(**odd), "MalformedResponse", True) for odd in ODD_CALLS),
        # token counts no transcript column holds: the run looped on each (the turn raised)
        *(({**say("Done."), "usage": usage}, "MalformedResponse", True) for usage in ODD_USAGE),
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


def test_a_call_past_the_endpoint_timeout_is_a_retryable_timeout(
    fake_llm: FakeLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", fake_llm.url)
    monkeypatch.setenv("OPENAI_TIMEOUT_S", "0.3")
    fake_llm.script("m", HANG)
    try:
        with pytest.raises(ProviderError) as failed:
            OpenAICompatibleProvider("default").complete(model="m", messages=MESSAGES, tools=[])
    finally:
        fake_llm.release.set()

    assert (failed.value.error_class, failed.value.retryable) == ("APITimeoutError", True)


@pytest.fixture
def fresh_process() -> Iterator[None]:
    """This process as a new worker finds it: no TLS context made, no client for any endpoint."""
    providers.tls.cache_clear()
    providers.openai_provider.cache_clear()
    yield
    providers.tls.cache_clear()
    providers.openai_provider.cache_clear()


def test_a_worker_makes_one_tls_context_at_its_start_for_every_client_of_its_pool(
    fresh_process: None, fake_llm: FakeLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each one reads and parses the whole CA bundle: made before the pool forks, not per client."""
    made: list[dict[str, Any]] = []
    real = httpcore2.default_ssl_context

    def counted(**kwargs: Any) -> Any:
        made.append(kwargs)
        return real(**kwargs)

    monkeypatch.setattr(httpcore2, "default_ssl_context", counted)
    monkeypatch.setenv("OPENAI_BASE_URL", fake_llm.url)
    monkeypatch.setenv("AGORA_ENDPOINT_LOCAL_BASE_URL", fake_llm.url)

    connected = [key[0] for key, _ in worker_init.receivers]
    assert "agents.warm_providers" in connected  # Celery calls it in the worker's parent, before the fork

    providers.warm()
    assert len(made) == 1
    clients = [providers.openai_provider(endpoint) for endpoint in ("default", "local")]
    fake_llm.script("m", say("hello"), say("again"))
    answers = [client.complete(model="m", messages=MESSAGES, tools=[]).content for client in clients]

    assert answers == ["hello", "again"]
    assert len(made) == 1  # the endpoints' clients verify with the one made at the start
