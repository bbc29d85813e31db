"""Numeric query parameters, read one way everywhere: ASCII digits only.

`str.isdigit()` and `int()` accept more than ASCII (`"²".isdigit()` is true and `int("²")` fails;
`int("١٢")` is 12), so each view that checked one way and converted another could answer 500. Every
cursor, limit and wait in the API, the journal export, the WebSocket and the dashboard goes through
here instead, and a bad value is a 400 `invalid_payload` naming the parameter.
"""

import re
from collections.abc import Mapping

from config.problems import Problem

_INTEGER = re.compile(r"[0-9]{1,19}")
_SECONDS = re.compile(r"[0-9]{1,9}(?:\.[0-9]{1,9})?")
MAX_INTEGER = 2**63 - 1  # the largest value a database integer column (and so a seq filter) holds


class InvalidParameter(Problem):
    code = "invalid_payload"
    status = 400
    title = "Invalid payload"

    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"{name}: {message}", errors={name: [message]})
        self.name = name


def integer_param(query: Mapping[str, str], name: str, *, default: int, minimum: int = 0) -> int:
    """The parameter as an integer from `minimum` up; `default` when absent or empty."""
    raw = query.get(name)
    if raw is None or raw == "":
        return default
    if not _INTEGER.fullmatch(raw) or not minimum <= int(raw) <= MAX_INTEGER:
        raise InvalidParameter(name, f"An integer of at least {minimum}, in ASCII digits.")
    return int(raw)


def seconds_param(query: Mapping[str, str], name: str, *, default: float = 0.0) -> float:
    """The parameter as a non-negative number of seconds (`2` or `0.5`); `default` when absent or empty."""
    raw = query.get(name)
    if raw is None or raw == "":
        return default
    if not _SECONDS.fullmatch(raw):
        raise InvalidParameter(name, "A non-negative number of seconds, in ASCII digits.")
    return float(raw)


FORM_KEY = "idempotency_key"  # the hidden field of a page's form that starts work (the `form_key` tag)
_FORM_KEY = re.compile(r"[0-9a-f]{32}")
# What a page says when one rendered form comes back with other text (its key's conflict).
FORM_SENT = "This form was sent already, with other text. Reload the page to send another."


def form_key(post: Mapping[str, str]) -> str:
    """The one-time key a page rendered into its form, as that form's Idempotency-Key: a form sent
    twice (a double click, a resubmit) does its work once. "" when absent or not one of ours."""
    key = post.get(FORM_KEY, "")
    return key if _FORM_KEY.fullmatch(key) else ""


def idempotency_key(headers: Mapping[str, str]) -> str:
    """A create's `Idempotency-Key` header, stripped ("" when absent); at most 200 characters."""
    key = headers.get("Idempotency-Key", "").strip()
    if len(key) > 200:
        raise InvalidParameter("Idempotency-Key", "At most 200 characters.")
    return key


def created_headers(location: str, created: bool) -> dict[str, str]:
    """A create's answer headers: where what it made is (if it has an address of its own), and for a
    replay of its Idempotency-Key `Idempotent-Replayed: true`."""
    return ({"Location": location} if location else {}) | ({} if created else {"Idempotent-Replayed": "true"})
