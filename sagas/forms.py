"""`ask_human` forms: the field schema an agent sends, and a person's answer checked against it."""

import datetime
import re
from typing import Any

from django.core.exceptions import ValidationError
from django.core.validators import validate_email

from sagas import errors

FIELD_TYPES = ("text", "textarea", "integer", "number", "boolean", "choice", "multichoice", "date", "email")
NAME_RE = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]{0,63}")  # fullmatch: `$` admits a final newline
MAX_FIELDS = 50
MAX_TEXT = 10_000


def check_schema(fields: Any) -> list[dict[str, Any]]:
    """Validate and normalise a form's fields; each is {name, label, type, required, choices}."""
    if not isinstance(fields, list) or not 1 <= len(fields) <= MAX_FIELDS:
        raise errors.InvalidPayload("A form has 1 to 50 fields.", errors={"fields": ["A list of 1 to 50 fields."]})
    problems: dict[str, list[str]] = {}
    clean, names = [], set()
    for i, field in enumerate(fields):
        where = f"fields[{i}]"
        if not isinstance(field, dict):
            problems[where] = ["Must be an object."]
            continue
        name, kind = field.get("name"), field.get("type", "text")
        choices, required = field.get("choices") or [], field.get("required", True)
        if not isinstance(name, str) or not NAME_RE.fullmatch(name) or name in names:
            problems[where] = ["A unique identifier `name` is required."]
        elif not isinstance(required, bool):  # "false" would read as true
            problems[where] = ["required is true or false."]
        elif kind not in FIELD_TYPES:
            problems[where] = [f"type must be one of {', '.join(FIELD_TYPES)}."]
        elif kind in ("choice", "multichoice") and (
            not isinstance(choices, list) or not choices or not all(isinstance(c, str) for c in choices)
        ):
            problems[where] = ["A choice field needs a list of string choices."]
        else:
            names.add(name)
            clean.append(
                {
                    "name": name,
                    "label": str(field.get("label") or name),
                    "type": kind,
                    "required": required,
                    "choices": choices if kind in ("choice", "multichoice") else [],
                }
            )
    if problems:
        raise errors.InvalidPayload("The form's fields are invalid.", errors=problems)
    return clean


def check_answer(fields: list[dict[str, Any]], answer: Any) -> dict[str, Any]:
    """The answer converted to the fields' types, or InvalidPayload naming each bad field."""
    if not isinstance(answer, dict):
        raise errors.InvalidPayload(
            "An answer is an object of field values.", errors={"answer": ["Must be an object."]}
        )
    problems: dict[str, list[str]] = {}
    clean: dict[str, Any] = {}
    known = {f["name"] for f in fields}
    for extra in set(answer) - known:
        problems[extra] = ["Not a field of this form."]
    for field in fields:
        value = answer.get(field["name"])
        if value is None or value == "" or value == []:
            if field["required"]:
                problems[field["name"]] = ["This field is required."]
            continue
        try:
            clean[field["name"]] = convert(field, value)
        except ValueError as exc:
            problems[field["name"]] = [str(exc)]
    if problems:
        raise errors.InvalidPayload("The answer does not fit the form.", errors=problems)
    return clean


def convert(field: dict[str, Any], value: Any) -> Any:
    kind = field["type"]
    if kind in ("text", "textarea"):
        if not isinstance(value, str) or len(value) > MAX_TEXT:
            raise ValueError(f"Enter text of at most {MAX_TEXT} characters.")
        return value
    if kind == "integer":
        if isinstance(value, bool) or not (
            isinstance(value, int) or (isinstance(value, str) and re.fullmatch(r"-?\d+", value.strip()))
        ):
            raise ValueError("Enter a whole number.")
        return int(value)
    if kind == "number":
        try:
            if isinstance(value, bool):
                raise TypeError
            number = float(value)
        except (TypeError, ValueError):
            raise ValueError("Enter a number.") from None
        except OverflowError:  # an integer past any float: JSON has them
            raise ValueError("Enter a finite number.") from None
        if number != number or number in (float("inf"), float("-inf")):
            raise ValueError("Enter a finite number.")
        return number
    if kind == "boolean":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "on", "yes", "1", "false", "off", "no", "0"):
            return value.lower() in ("true", "on", "yes", "1")
        raise ValueError("Enter true or false.")
    if kind == "choice":
        if value not in field["choices"]:
            raise ValueError(f"Choose one of: {', '.join(field['choices'])}.")
        return value
    if kind == "multichoice":
        values = value if isinstance(value, list) else [value]
        if not all(v in field["choices"] for v in values):
            raise ValueError(f"Choose among: {', '.join(field['choices'])}.")
        return values
    if kind == "date":
        try:
            if not isinstance(value, str):  # fromisoformat(str(20261129)) would accept a number
                raise ValueError
            return datetime.date.fromisoformat(value).isoformat()
        except ValueError:
            raise ValueError("Enter a date as YYYY-MM-DD.") from None
    if not isinstance(value, str):  # validate_email raises TypeError on other types
        raise ValueError("Enter a valid email address.")
    try:
        validate_email(value)
    except ValidationError:
        raise ValueError("Enter a valid email address.") from None
    return value
