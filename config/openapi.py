"""How drf-spectacular writes the OpenAPI document, beyond what it infers: the parts a client
generator and a schema-driven fuzzer read (REST_FRAMEWORK["DEFAULT_SCHEMA_CLASS"])."""

import inspect
import re
from typing import Any

from drf_spectacular import openapi
from drf_spectacular.plumbing import list_hash
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, PolymorphicProxySerializer
from rest_framework import serializers


class EnumField(serializers.CharField):
    """An output string from a fixed set of (value, label) choices, documented as an `enum` named
    as drf-spectacular names a ChoiceField's (settings: ENUM_NAME_OVERRIDES names the sets that
    share a field name). The set is an argument, not an attribute set afterwards: DRF rebuilds
    each field from its arguments."""

    def __init__(self, *, enum_choices: list[tuple[str, str]], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.enum_choices = [(str(value), str(label)) for value, label in enum_choices]


def enum_field(choices: Any, **kwargs: Any) -> serializers.CharField:
    return EnumField(enum_choices=list(choices), **kwargs)


class AutoSchema(openapi.AutoSchema):
    def _map_serializer_field(self, field: Any, direction: Any, bypass_extensions: bool = False) -> dict[str, Any]:
        schema: dict[str, Any] = super()._map_serializer_field(field, direction, bypass_extensions)
        if choices := getattr(field, "enum_choices", None):
            schema["enum"] = [value for value, _ in choices]
            schema["x-spec-enum-id"] = list_hash(choices)  # how the enum hook groups and names sets
        elif pattern := getattr(field, "schema_pattern", None):
            schema["pattern"] = pattern
        elif isinstance(field, serializers.JSONField) and direction == "request" and not field.allow_null:
            if not set(schema) - {"description", "default"}:  # any JSON value but null
                schema["anyOf"] = [
                    {"type": "object", "additionalProperties": {}},
                    {"type": "array", "items": {}},
                    {"type": "string"},
                    {"type": "number"},
                    {"type": "boolean"},
                ]
        elif (
            direction == "request"
            and isinstance(field, serializers.CharField)
            and not field.allow_blank
            and schema.get("type") == "string"
            and "format" not in schema
        ):
            # What DRF's CharField accepts: not empty, and (trimmed as it is by default) not blank.
            schema.setdefault("minLength", 1)
            if field.trim_whitespace:
                schema.setdefault("pattern", r"\S")
        return schema

    def _get_request_for_media_type(self, serializer: Any, direction: Any = "request") -> tuple[Any, bool]:
        """A body that is one of several shapes is required (drf-spectacular decides from a single
        shape's required fields, which a union has none of)."""
        schema, required = super()._get_request_for_media_type(serializer, direction)
        return schema, required or (schema is not None and isinstance(serializer, PolymorphicProxySerializer))

    def _get_response_bodies(self, direction: Any = "response") -> dict[str, Any]:
        """Every throttled operation (agents' request quota, sign-in limits) may answer 429."""
        responses: dict[str, Any] = super()._get_response_bodies(direction)
        if "429" not in responses and self.view.get_throttles():
            problem = OpenApiResponse(ProblemOutput, description="Throttled: wait as `Retry-After` says.")
            responses["429"] = self._get_response_for_code(problem, "429", ["application/problem+json"], direction)
        return responses

    def _map_basic_serializer(self, serializer: Any, direction: Any) -> dict[str, Any]:
        """A component's description is its own class's docstring; never one inherited from a base
        (drf-spectacular walks the bases, so every shape would read as the base class's notes)."""
        schema: dict[str, Any] = super()._map_basic_serializer(serializer, direction)
        own = type(serializer).__dict__.get("__doc__")
        if own:
            schema["description"] = inspect.cleandoc(own)
        else:
            schema.pop("description", None)
        # Fields a shape leaves out when they have no value (see SteeringItemOutput.OPTIONAL).
        omitted = set(getattr(serializer, "OPTIONAL", ()))
        if omitted and "required" in schema:
            schema["required"] = [name for name in schema["required"] if name not in omitted]
        return schema


class ProblemOutput(serializers.Serializer):
    """An error, as `application/problem+json`, with a stable `code`."""

    type = serializers.CharField()
    title = serializers.CharField()
    status = serializers.IntegerField()
    code = serializers.CharField(help_text="A stable error code such as not_found or deadlock.")
    detail = serializers.CharField()

    def get_fields(self) -> dict[str, serializers.Field]:
        fields: dict[str, serializers.Field] = super().get_fields()
        # `errors` cannot be declared on a serializer (it is the name of its validation errors).
        fields["errors"] = serializers.DictField(
            child=serializers.JSONField(),
            required=False,
            help_text="Field errors: a list of messages per field, an object of them for a field with parts.",
        )
        return fields


IDEMPOTENCY_KEY = OpenApiParameter(
    "Idempotency-Key",
    OpenApiTypes.STR,
    OpenApiParameter.HEADER,
    description="Retries with the same key and body return the first result; another body → 409.",
)


def problems(*statuses: int) -> dict[tuple[int, str], OpenApiResponse]:
    """The error responses an operation documents, all `application/problem+json`."""
    problem = OpenApiResponse(ProblemOutput, description="A problem with a stable `code`.")
    return {(status, "application/problem+json"): problem for status in statuses}


class FullMatch:
    """A validator for strings that must match `pattern` whole (Python's `$` would let a trailing
    newline through); the pattern is also the field's OpenAPI `pattern`."""

    def __init__(self, pattern: str, message: str) -> None:
        self.regex = re.compile(pattern)
        self.message = message

    def __call__(self, value: str) -> None:
        if not self.regex.fullmatch(value):
            raise serializers.ValidationError(self.message, code="invalid")


class PatternField(serializers.CharField):
    """A string that must match `pattern` whole, as it is sent (not trimmed first)."""

    def __init__(self, *, pattern: str, message: str, **kwargs: Any) -> None:
        kwargs.setdefault("trim_whitespace", False)
        super().__init__(**kwargs)
        self.validators.append(FullMatch(pattern, message))
        self.schema_pattern = f"^{pattern}$"


def patterned(pattern: str, message: str, **kwargs: Any) -> serializers.CharField:
    return PatternField(pattern=pattern, message=message, **kwargs)


# A cursor or a count in a query string: any larger value is refused rather than overflowing.
MAX_QUERY_INT = 2**63 - 1


class Shape(serializers.Serializer):
    """A serializer whose fields may be named as Python or DRF cannot declare them (`from`, and
    `fields`, `errors`, `data`, `parent`, `label`, `required` of a serializer): such a field is
    declared with a trailing underscore, dropped here."""

    def get_fields(self) -> dict[str, serializers.Field]:
        return {name.removesuffix("_"): field for name, field in super().get_fields().items()}

    def to_internal_value(self, data: Any) -> Any:
        # DRF's CharField takes a number for a string (0 → "0"): the schema says string, so do we.
        if isinstance(data, dict):
            wrong = {
                name: ["Not a string."]
                for name, field in self.fields.items()
                if isinstance(field, serializers.CharField)
                and not field.read_only
                and data.get(name) is not None
                and not isinstance(data[name], str)
            }
        else:
            wrong = {}
        try:
            value = super().to_internal_value(data)
        except serializers.ValidationError as exc:
            if wrong and isinstance(exc.detail, dict):
                raise serializers.ValidationError({**exc.detail, **wrong}) from None
            raise
        if wrong:
            raise serializers.ValidationError(wrong)
        return value
