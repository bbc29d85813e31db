"""The offline provider's playbooks: a deterministic "model" that reads the engine-written steering
headers in the conversation and answers with tool calls.

A playbook is JSON: `steps` (tool calls made one per model call, in order), `replies` (the
payload to reply with per request type, `*` for any), `ask_back` (asks each request's sender a
question before it replies, and replies with the answer), `chat` (with `ask_back`: asks again after
each answer or follow-up until the sender says one of the `until` words, so one request is a
conversation of several messages) and `on_broadcast` (a teammate's answer to
each broadcast it hears: `type` and `payload` of an ask back to the lead). A step may wait
`after` requests of a type have arrived. Its tool-call ids are derived from the
conversation, so a model call re-executed after a crash asks for exactly the same effects, which
the idempotency keys then deduplicate.
"""

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

from django.conf import settings

HEADER_RE = re.compile(r"^<<agora (?P<attrs>[^>]*)>>$", re.MULTILINE)
ATTR_RE = re.compile(r'(\w+)="([^"]*)"')


class UnknownPlaybook(Exception):
    pass


def header(**attrs: Any) -> str:
    """The engine-written header of one steering item; models and playbooks both read it."""
    return "<<agora " + " ".join(f'{k}="{v}"' for k, v in attrs.items() if v not in (None, "")) + ">>"


def text_of(content: Any) -> str:
    """A message's text: its content, or its text parts joined (a message that carries images)."""
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text")
    return str(content or "")


def parse_items(content: str) -> list[tuple[dict[str, str], Any]]:
    """The (header attributes, payload) pairs in a rendered steering message."""
    matches = list(HEADER_RE.finditer(content))
    items = []
    for i, match in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(content)
        body = content[match.end() : end].strip()
        try:
            payload = json.loads(body) if body else None
        except json.JSONDecodeError:
            payload = body
        items.append((dict(ATTR_RE.findall(match.group("attrs"))), payload))
    return items


@cache
def playbook_dirs() -> list[Path]:
    return [Path(__file__).parent / "playbooks", *map(Path, settings.AGORA_PLAYBOOK_DIRS)]


# Parsed playbooks by path, with the (mtime, size) they were read at: every model call needs its
# playbook, and reading and parsing a long one costs more than the rest of the call. An edited
# file is read again. Callers only read what they get.
_parsed: dict[Path, tuple[tuple[int, int], dict[str, Any]]] = {}


def load_playbook(name: str) -> dict[str, Any]:
    if re.fullmatch(r"[a-z0-9][a-z0-9_-]*", name):
        for folder in playbook_dirs():
            path = folder / f"{name}.json"
            try:
                stat = path.stat()
            except FileNotFoundError:
                continue
            version = (stat.st_mtime_ns, stat.st_size)
            cached = _parsed.get(path)
            if cached is None or cached[0] != version:
                cached = _parsed[path] = (version, dict(json.loads(path.read_text())))
            return cached[1]
    raise UnknownPlaybook(f"No playbook {name!r}.")


def next_move(name: str, messages: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """(text, tool calls) for the conversation so far."""
    playbook = load_playbook(name)
    last_assistant = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=-1)
    calls = []
    for message in messages[last_assistant + 1 :]:
        if message["role"] != "user":
            continue
        for attrs, payload in parse_items(text_of(message.get("content"))):
            if attrs.get("kind") == "request" and (question := ask_back(playbook, attrs)):
                calls.append(question)
            elif attrs.get("kind") == "request" and (reply := reply_for(playbook, attrs.get("type", ""), payload)):
                calls.append(
                    call(f"reply-{attrs['request_id']}", "reply", {"request_id": attrs["request_id"], **reply})
                )
            if attrs.get("kind") == "response" and (answered := reply_with_answer(playbook, attrs, payload, messages)):
                calls.append(answered)
            if attrs.get("kind") == "message" and (went_on := chat_on(playbook, attrs, payload, messages)):
                calls.append(went_on)
            if attrs.get("broadcast_id") and (answer := playbook.get("on_broadcast")):
                calls.append(answer_broadcast(answer, attrs, payload))
    done = sum(
        1 for m in messages if m["role"] == "assistant" for c in m.get("tool_calls", []) if c["id"].startswith("step-")
    )
    steps = playbook.get("steps", [])
    if done < len(steps) and ready(steps[done], messages):
        step = steps[done]
        calls.append(call(f"step-{done}", step["tool"], step.get("args", {})))
    text = "" if calls else playbook.get("idle_text", "Nothing more to do for now.")
    return text, calls


def ready(step: dict[str, Any], messages: list[dict[str, Any]]) -> bool:
    """A step with `after: {"type", "count"}` waits until that many requests of the type arrived
    (a lead that collects its teammates' answers before it goes on); other steps are always ready."""
    after = step.get("after")
    if not after:
        return True
    seen = sum(
        1
        for m in messages
        if m["role"] == "user"
        for attrs, _ in parse_items(text_of(m.get("content")))
        if attrs.get("kind") == "request" and attrs.get("type") == after["type"]
    )
    return seen >= int(after.get("count", 1))


def reply_for(playbook: dict[str, Any], type: str, payload: Any) -> dict[str, Any] | None:
    replies = playbook.get("replies", {})
    if type in replies:
        return {"payload": replies[type]}
    if "*" in replies:
        return {"payload": {"echo": payload} if replies["*"] == "echo" else replies["*"]}
    return None


def ask_back(playbook: dict[str, Any], attrs: dict[str, str]) -> dict[str, Any] | None:
    """A playbook's `ask_back` (`type`: the request type it applies to, `*` for any; `question`):
    an `ask_agent` in async mode back to the request's sender, naming the request as `task_id`
    (how the A2A gateway tells which task the question is about). Async, because a sender that
    waits on this request would make a `wait` back a cycle, which the kernel refuses."""
    spec = playbook.get("ask_back")
    if not spec or spec.get("type", "*") not in ("*", attrs.get("type")):
        return None
    body = {"task_id": attrs["request_id"], "question": spec.get("question", "Tell me more?")}
    args = {"to": attrs["from"], "type": spec.get("ask_type", "question"), "mode": "async", "payload": body}
    return call(f"ask-{attrs['request_id']}", "ask_agent", args)


def reply_with_answer(
    playbook: dict[str, Any], attrs: dict[str, str], payload: Any, messages: list[dict[str, Any]]
) -> dict[str, Any] | None:
    """The answer to an `ask_back` question completes the request it was about, with the answer."""
    if not playbook.get("ask_back") or attrs.get("status") != "completed":
        return None
    for message in messages:  # which request the question was about: the ask's own tool call id
        call_id = str(message.get("tool_call_id", ""))
        if message["role"] == "tool" and call_id.startswith("ask-"):
            try:
                asked = json.loads(message.get("content") or "{}").get("request_id")
            except (json.JSONDecodeError, AttributeError):
                continue
            if asked == attrs.get("request_id"):
                request_id = call_id.removeprefix("ask-").split(".")[0]  # ask-<request>[.<n>]
                if (again := chat_again(playbook, request_id, attrs.get("from", ""), payload, messages)) is not None:
                    return again
                answer = {"asked": playbook["ask_back"].get("question", ""), "answer": payload}
                return call(f"reply-{request_id}", "reply", {"request_id": request_id, "payload": answer})
    return None


def text_in(payload: Any) -> str:
    """The text parts of an A2A message body (an answer or a follow-up), else its JSON."""
    if isinstance(payload, dict) and isinstance(payload.get("parts"), list):
        return " ".join(str(part.get("text", "")) for part in payload["parts"] if isinstance(part, dict))
    return payload if isinstance(payload, str) else json.dumps(payload)


def chat_again(
    playbook: dict[str, Any], request_id: str, to: str, payload: Any, messages: list[dict[str, Any]]
) -> dict[str, Any] | None:
    """A `chat` playbook's next move on the sender's answer or follow-up about a request: another
    question (`ask-<request>.<n>`, n counting its earlier ones), or None when the sender said one of
    the `until` words (the caller then replies). A reply ends the conversation: after it, nothing."""
    spec = playbook.get("chat")
    if not spec:
        return None
    said = text_in(payload).lower()
    if any(re.search(rf"\b{re.escape(word.lower())}\b", said) for word in spec.get("until", ["done"])):
        return None
    asked = sum(
        1
        for m in messages
        if m["role"] == "assistant"
        for c in m.get("tool_calls", [])
        if c["id"] == f"ask-{request_id}" or c["id"].startswith(f"ask-{request_id}.")
    )
    body = {"task_id": request_id, "question": spec.get("question", "Anything else?")}
    args = {"to": to, "type": playbook["ask_back"].get("ask_type", "question"), "mode": "async", "payload": body}
    return call(f"ask-{request_id}.{asked}", "ask_agent", args)


def chat_on(
    playbook: dict[str, Any], attrs: dict[str, str], payload: Any, messages: list[dict[str, Any]]
) -> dict[str, Any] | None:
    """A follow-up (a steering message `{"request_id", "message"}`) to a request a `chat`
    playbook is talking about: another question, or the reply when the sender is done."""
    if not playbook.get("chat") or not isinstance(payload, dict) or not isinstance(payload.get("request_id"), str):
        return None
    request_id = payload["request_id"]
    started = any(
        c["id"] == f"ask-{request_id}" for m in messages if m["role"] == "assistant" for c in m.get("tool_calls", [])
    )
    if not started:
        return None
    if (again := chat_again(playbook, request_id, attrs.get("from", ""), payload.get("message"), messages)) is not None:
        return again
    answer = {"asked": playbook["ask_back"].get("question", ""), "answer": payload.get("message")}
    return call(f"reply-{request_id}", "reply", {"request_id": request_id, "payload": answer})


def answer_broadcast(answer: dict[str, Any], attrs: dict[str, str], payload: Any) -> dict[str, Any]:
    """A playbook's `on_broadcast`: an `ask_agent` of `type` back to the broadcast's sender, with the
    playbook's `payload` and the broadcast it answers."""
    body = {"broadcast_id": attrs["broadcast_id"], "heard": payload, **answer.get("payload", {})}
    args = {"to": attrs["from"], "type": answer.get("type", "team.reply"), "mode": "async", "payload": body}
    return call(f"answer-{attrs['broadcast_id']}", "ask_agent", args)


def call(call_id: str, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "name": tool, "arguments": json.dumps(args)}
