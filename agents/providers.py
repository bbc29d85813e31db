"""Model providers behind one small interface. A provider raises ProviderError, which says whether
trying again could help; the fallback loop catches only that."""

import json
import os
import ssl
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Protocol

import httpx2
import openai

from agents import scripted
from config import metrics
from config.payloads import storable_text


class ProviderError(Exception):
    def __init__(self, message: str, *, retryable: bool, error_class: str) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.error_class = error_class


@dataclass
class Completion:
    model: str
    content: str
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # [{"id", "name", "arguments": str}]
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def __post_init__(self) -> None:
        # What a model writes is kept in its transcript: text no database can store is replaced
        # here, where it enters. Escaped NULs or surrogates inside tool arguments parse to such text
        # and are refused by the tool (agents/tools.py).
        self.content = storable_text(self.content or "")
        self.tool_calls = [
            {k: storable_text(v) if isinstance(v, str) else v for k, v in c.items()} for c in self.tool_calls
        ]

    def as_message(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = [
                {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                for c in self.tool_calls
            ]
        return message


class Provider(Protocol):
    def complete(self, *, model: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Completion: ...


def endpoint_settings(name: str) -> dict[str, Any]:
    """`default` reads OPENAI_BASE_URL / OPENAI_API_KEY; a named endpoint reads AGORA_ENDPOINT_<NAME>_*."""
    prefix = "OPENAI" if name == "default" else f"AGORA_ENDPOINT_{name.upper().replace('-', '_')}"
    return {
        "base_url": os.environ.get(f"{prefix}_BASE_URL") or None,
        "api_key": os.environ.get(f"{prefix}_API_KEY") or "not-needed",
        "timeout": float(os.environ.get(f"{prefix}_TIMEOUT_S", "60")),
    }


class OpenAICompatibleProvider:
    """Chat completions with tool calling through the `openai` client: OpenAI, vLLM, Ollama, llama.cpp.

    The request goes through the client's own HTTP layer (`client.post`: its base URL, key,
    timeout and errors), with the body and the answer as plain JSON: messages and tools are JSON
    already, and reading three fields of the answer needs no typed model. The typed
    `chat.completions.create` walks every message and tool against its type hints and builds a
    typed model of the whole answer: several milliseconds of CPU per call (bench/model_client.py),
    which the other turns of a busy worker wait for."""

    RETRYABLE = (openai.APITimeoutError, openai.APIConnectionError, openai.RateLimitError, openai.InternalServerError)

    def __init__(self, endpoint: str) -> None:
        # The fallback chain is the retry policy: one attempt per candidate. The HTTP client is the
        # one the `openai` client would make (its defaults, DefaultHttpxClient), verifying with the
        # process's one TLS context.
        http = openai.DefaultHttpxClient(verify=tls(), event_hooks={"request": [traced]})
        self.client = openai.OpenAI(**endpoint_settings(endpoint), max_retries=0, http_client=http)

    def complete(self, *, model: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Completion:
        body: dict[str, Any] = {"model": model, "messages": messages, **({"tools": tools} if tools else {})}
        try:
            # `object`: the answer as the JSON it is (its text, when it is not JSON).
            return completion_from(model, self.client.post("/chat/completions", body=body, cast_to=object))
        except self.RETRYABLE as exc:
            raise ProviderError(str(exc), retryable=True, error_class=type(exc).__name__) from exc
        except openai.OpenAIError as exc:
            raise ProviderError(str(exc), retryable=False, error_class=type(exc).__name__) from exc
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:  # JSON, not a completion's
            raise ProviderError(
                f"malformed completion: {exc!r}", retryable=True, error_class="MalformedResponse"
            ) from exc


def completion_from(model: str, answer: Any) -> Completion:
    """A chat completion's first choice and its usage, as the API documents them."""
    message = answer["choices"][0]["message"]
    content = message.get("content") or ""
    if not isinstance(content, str):
        raise TypeError(f"content is {type(content).__name__}, not text")
    calls = [tool_call_of(c) for c in message.get("tool_calls") or [] if c.get("type", "function") == "function"]
    usage = answer.get("usage") or {}
    return Completion(
        model=model,
        content=content,
        tool_calls=calls,
        prompt_tokens=token_count(usage.get("prompt_tokens")),
        completion_tokens=token_count(usage.get("completion_tokens")),
    )


def token_count(value: Any) -> int:
    """A count of tokens a completion's usage gives: a whole number a transcript's column holds
    (none: 0); anything else (infinite, negative, past 2^31) is no completion's."""
    value = value or 0
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 2**31 or value % 1:
        raise TypeError(f"a token count is a whole number from 0, not {value!r}")
    return int(value)


def tool_call_of(call: dict[str, Any]) -> dict[str, str]:
    """One tool call of a completion: its id, its function's name and its arguments as JSON text
    (some servers send them as an object); a name or id that is not text is no completion's."""
    function, id = call["function"], call["id"] or ""
    arguments = function.get("arguments") or ""
    if isinstance(arguments, dict):
        arguments = json.dumps(arguments, ensure_ascii=False)
    if not all(isinstance(value, str) for value in (id, function["name"], arguments)):
        raise TypeError("a tool call's id, name and arguments are text")
    return {"id": id, "name": function["name"], "arguments": arguments}


class ScriptedProvider:
    """Deterministic playbooks for the offline demo and tests, on the same tool-calling path."""

    def complete(self, *, model: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Completion:
        name = model.removeprefix("scripted:")
        try:
            content, calls = scripted.next_move(name, messages)
        except scripted.UnknownPlaybook as exc:
            raise ProviderError(str(exc), retryable=False, error_class="UnknownPlaybook") from exc
        return Completion(model=model, content=content, tool_calls=calls)


# What runs once a model call's request is out and its answer not yet read (once_sent()).
_on_sent: ContextVar[Callable[[], None] | None] = ContextVar("on_sent", default=None)


@contextmanager
def once_sent(callback: Callable[[], None]) -> Iterator[None]:
    """Run `callback` during the model calls made in this block, once each one's request is sent
    and before its answer is read: work that may overlap the model's own time. It must not raise
    (whatever it raised would fail the call as the provider's error)."""
    token = _on_sent.set(callback)
    try:
        yield
    finally:
        _on_sent.reset(token)


def traced(request: httpx2.Request) -> None:
    """The HTTP client's request hook: under once_sent(), the callback runs at the transport's
    `receive_response_headers.started` (the request is out; httpcore's `trace` extension)."""
    if (callback := _on_sent.get()) is None:
        return

    def trace(event: str, info: dict[str, Any]) -> None:
        if event.endswith("receive_response_headers.started"):
            callback()

    request.extensions["trace"] = trace


@cache
def openai_provider(endpoint: str) -> OpenAICompatibleProvider:
    """One client (and connection pool) per endpoint and process."""
    return OpenAICompatibleProvider(endpoint)


@cache
def tls() -> ssl.SSLContext:
    """The HTTP client's default certificate verification (the system's CA certificates, or
    SSL_CERT_FILE / SSL_CERT_DIR), made once per process and shared by every endpoint's client:
    making it reads and parses every CA certificate, 20-40 ms, which each client would pay again."""
    return httpx2.create_ssl_context()


def warm(**_: Any) -> None:
    """At a worker's start, before it forks its pool processes (Celery's `worker_init`): what a
    client makes on its first use (the TLS context, the HTTP modules it imports then, the platform
    headers it sends with every request), made in the parent and inherited by every pool process,
    so that none pays for them on its first model call (bench/first_model_call.py)."""
    with openai.OpenAI(
        api_key="-", base_url="http://127.0.0.1/", http_client=openai.DefaultHttpxClient(verify=tls())
    ) as client:
        client.default_headers  # noqa: B018 (read for the platform headers it caches)


class Measured:
    """A provider whose calls are timed and whose failures are counted, by model (config/metrics.py)."""

    def __init__(self, provider: Provider) -> None:
        self.provider = provider

    def complete(self, *, model: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Completion:
        started = time.perf_counter()
        try:
            completion = self.provider.complete(model=model, messages=messages, tools=tools)
        except ProviderError as exc:
            metrics.model_call_done(model, time.perf_counter() - started, error_class=exc.error_class)
            raise
        metrics.model_call_done(model, time.perf_counter() - started)
        return completion


def is_scripted(model: str) -> bool:
    """A playbook's model: answered in this process, without a call out of it."""
    return model.startswith("scripted:")


def provider_for(model: str, endpoint: str) -> Provider:
    return Measured(ScriptedProvider() if is_scripted(model) else openai_provider(endpoint))
