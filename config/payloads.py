"""What any input must be before anything stores it: JSON no deeper than a limit, and text that
every database we run on can store.

Checked at each edge where input enters (the REST parser, WebSocket messages, dashboard forms and
query strings, a model's tool-call arguments), so that bad input is refused there with
`invalid_payload` instead of failing deep inside a write (a `RecursionError` while parsing or
serializing, a `UnicodeEncodeError` on a lone surrogate, PostgreSQL refusing NUL in text and jsonb).
"""

import json
import math
import re
from typing import Any

from django.conf import settings

REPLACEMENT = "\ufffd"
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


class Unstorable(ValueError):
    """Input that cannot be stored as it is; the message says where and why."""


class MalformedJson(Unstorable):
    """Text that is not JSON at all."""


def max_depth() -> int:
    return int(getattr(settings, "AGORA_MAX_JSON_DEPTH", 64))


def text_problem(text: str) -> str | None:
    """Why a string cannot be stored, or None. NUL is refused on every database, so that the same
    input is accepted or refused the same way on SQLite as on PostgreSQL."""
    if "\x00" in text:
        return "contains a NUL character"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "contains a lone UTF-16 surrogate"
    return None


def check_storable(value: Any, *, where: str = "payload") -> None:
    """Raise Unstorable unless value nests at most `AGORA_MAX_JSON_DEPTH` deep, all its keys are
    text, all its strings (keys included) are storable and all its numbers finite (no JSON column
    holds NaN). Iterative, so that a deep value cannot exhaust the stack here."""
    limit = max_depth()
    stack: list[tuple[Any, int, str]] = [(value, 0, where)]
    while stack:
        item, depth, path = stack.pop()
        if isinstance(item, str):
            if problem := text_problem(item):
                raise Unstorable(f"{path} {problem}.")
        elif isinstance(item, float) and not math.isfinite(item):
            raise Unstorable(f"{path} is not a finite number.")
        elif isinstance(item, dict | list | tuple):
            if depth >= limit:
                raise Unstorable(f"{path} nests deeper than {limit} levels.")
            if isinstance(item, dict):
                for key, child in item.items():
                    if not isinstance(key, str):  # JSON's never are; YAML's may be
                        raise Unstorable(f"Keys are text: {key!r} is not (in {path}).")
                    if problem := text_problem(key):
                        raise Unstorable(f"A key in {path} {problem}.")
                    stack.append((child, depth + 1, f"{path}.{key}"))
            else:
                stack.extend((child, depth + 1, f"{path}[{i}]") for i, child in enumerate(item))


def loads(text: str | bytes, *, where: str = "payload") -> Any:
    """json.loads, then check_storable; Unstorable for anything wrong, including malformed JSON.

    The C scanner recurses once per nesting level and raises RecursionError past the interpreter's
    limit: that, too, is the client's input, not a server error.
    """
    try:
        value = json.loads(text, parse_constant=_not_json, parse_float=_finite)
    except RecursionError:
        raise Unstorable(f"{where} nests deeper than {max_depth()} levels.") from None
    except (ValueError, TypeError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise MalformedJson(f"{where} is not valid JSON: {exc}.") from None
    check_storable(value, where=where)
    return value


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")  # NaN, Infinity: Python's extension, which no JSON column stores


def _finite(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise ValueError(f"{text} is out of range")  # 1e400 would be read as infinity
    return number


def storable_value(value: Any) -> Any:
    """A JSON value with storable_text applied to every string in it, keys included: JSON a model
    wrote (its escapes, `\\u0000`, become the characters no column stores once it is read)."""
    if isinstance(value, str):
        return storable_text(value)
    if isinstance(value, list):
        return [storable_value(item) for item in value]
    if isinstance(value, dict):
        return {storable_text(key): storable_value(item) for key, item in value.items()}
    return value


def storable_text(text: str) -> str:
    """text with NUL and lone surrogates replaced by U+FFFD: for output we keep rather than refuse
    (a model's message)."""
    if text_problem(text) is None:
        return text
    return _UNSTORABLE.sub(REPLACEMENT, text)
