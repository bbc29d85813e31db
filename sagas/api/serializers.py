"""Input and output shapes of the REST API (DESIGN.md §6, API_EXAMPLES.md). Shapes only: every rule
about what may happen lives in the kernel's actions."""

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from config import openapi
from config.openapi import Shape, enum_field
from sagas.actions.collaborators import NAME_PATTERN
from sagas.actions.requests import TYPE_PATTERN
from sagas.forms import FIELD_TYPES
from sagas.models import AgentRequest, Collaborator, HumanRequest, Run, Saga, SteeringItem


def one_of(choices: Any, **kwargs: Any) -> serializers.CharField:
    """An output string from a fixed set, documented as an inline enum: several sets share a field
    name (`status` of sagas, runs, requests and forms; `kind`), and named enum components for them
    would collide."""
    return enum_field(choices, **kwargs)


ProblemOutput = openapi.ProblemOutput  # shared with accounts' token endpoint


# --- sagas ---------------------------------------------------------------------------------------


class SagaCreateInput(Shape):
    title = serializers.CharField(max_length=200)
    goal = serializers.CharField(allow_blank=True, required=False, default="")
    policy = serializers.ChoiceField(choices=Saga.Policy.choices, default=Saga.Policy.TREE)


class SagaOutput(Shape):
    id = serializers.UUIDField()
    title = serializers.CharField()
    goal = serializers.CharField()
    policy = one_of(Saga.Policy.choices)
    status = one_of(Saga.Status.choices)
    owner = serializers.SerializerMethodField()
    created_at = serializers.DateTimeField()

    def get_owner(self, saga: Saga) -> str:
        return f"human:{saga.owner.username}"


class SagaFinishInput(Shape):
    status = serializers.ChoiceField(choices=["completed", "cancelled"])
    reason = serializers.CharField(
        allow_blank=True, required=False, default="", help_text="Journaled with `saga.finished`."
    )


class SagaListOutput(Shape):
    sagas = SagaOutput(many=True)


# --- collaborators -------------------------------------------------------------------------------


class AgentAddInput(Shape):
    kind = serializers.ChoiceField(choices=["agent"])
    name = openapi.patterned(
        NAME_PATTERN, "Lowercase letters, digits, '.', '_' and '-'.", max_length=64,
        help_text="Gives the stable id agent:<name>.",
    )  # fmt: skip
    role = serializers.CharField(max_length=120, allow_blank=True, default="")
    task = serializers.CharField(allow_blank=True, default="")
    runtime = serializers.ChoiceField(
        choices=[Collaborator.Runtime.INTERNAL, Collaborator.Runtime.EXTERNAL], default=Collaborator.Runtime.EXTERNAL
    )
    profile = serializers.CharField(max_length=64, allow_blank=True, default="", help_text="For internal agents.")
    parent_ = serializers.CharField(
        max_length=160, required=False, allow_null=True, default=None, help_text="The delegator, such as agent:lead."
    )
    resumable = serializers.BooleanField(default=False)


class HumanAddInput(Shape):
    kind = serializers.ChoiceField(choices=["human"])
    username = serializers.CharField(max_length=150)
    role = serializers.CharField(max_length=120, allow_blank=True, default="")
    task = serializers.CharField(allow_blank=True, default="")


class CollaboratorOutput(Shape):
    """One collaborator as `get_collaborators` shows it (a card from `sagas.access.collaborator_card`)."""

    id = serializers.CharField(help_text="agent:<name> or human:<name>")
    kind = one_of(Collaborator.Kind.choices)
    role = serializers.CharField()
    task = serializers.CharField()
    status = one_of(Run.Status.choices, required=False, help_text="Agents only.")
    run_id = serializers.CharField(required=False, help_text="Agents only.")
    team_status = serializers.CharField(required=False, help_text="Teammates only: working, idle, waiting or shutdown.")


class CollaboratorAddedOutput(CollaboratorOutput):
    token = serializers.CharField(required=False, help_text="An external agent's API token, shown this once.")


class CollaboratorListOutput(Shape):
    collaborators = CollaboratorOutput(many=True)


class SteerInput(Shape):
    message = serializers.JSONField(help_text="Usually text; any JSON value.")


class SteerOutput(Shape):
    to = serializers.CharField()
    seq = serializers.IntegerField(help_text="Its place in the agent's steering.")


class ExposureInput(Shape):
    exposed = serializers.BooleanField(help_text="Whether A2A clients may reach this agent (it gets an agent card).")


class ExposureOutput(Shape):
    id = serializers.CharField()
    exposed = serializers.BooleanField()


# --- requests between agents ---------------------------------------------------------------------


class SecondsField(serializers.FloatField):
    """A number of seconds. DRF's FloatField takes `true` as 1.0 (True is an int to Python): not here."""

    def to_internal_value(self, data: Any) -> float:
        if isinstance(data, bool):
            self.fail("invalid")
        return float(super().to_internal_value(data))


class AskInput(Shape):
    """`ask_agent`. The sender is the authenticated agent: any `from` in the body is ignored."""

    to = openapi.patterned(
        r"(agent|human):[A-Za-z0-9_.@+-]{1,150}", "A collaborator id such as agent:coder-01.",
        max_length=160, help_text="The recipient, such as agent:coder-01.",
    )  # fmt: skip
    type = openapi.patterned(
        TYPE_PATTERN, "A short dotted name such as code.review.",
        max_length=100, help_text="A short dotted name such as code.review.",
    )  # fmt: skip
    payload = serializers.JSONField(default=dict)
    mode = serializers.ChoiceField(choices=AgentRequest.Mode.choices, default=AgentRequest.Mode.ASYNC)
    timeout_s = SecondsField(
        required=False, allow_null=True, default=None, min_value=0.001,
        help_text="For mode=wait: seconds; more than the server's maximum is cut to it.",
    )  # fmt: skip


class AskPendingOutput(Shape):
    request_id = serializers.CharField()
    status = enum_field([("pending", "pending")])
    timed_out = serializers.BooleanField(required=False, help_text="Only when a wait ran out of time.")


class AskOutcomeOutput(Shape):
    """How a request ended, as the sender learns it."""

    request_id = serializers.CharField()
    status = one_of(AgentRequest.Status.choices)
    from_ = serializers.CharField(help_text="The recipient that answered.")
    payload = serializers.JSONField(allow_null=True)
    error = serializers.JSONField(required=False, help_text='{"code", "message"} when it failed.')


class AgentRequestOutput(Shape):
    request_id = serializers.CharField(source="pk")
    from_ = serializers.CharField(source="sender.handle")
    to = serializers.CharField(source="recipient.handle")
    type = serializers.CharField()
    payload = serializers.JSONField()
    mode = one_of(AgentRequest.Mode.choices)
    status = one_of(AgentRequest.Status.choices)
    reply = serializers.JSONField(allow_null=True)
    error = serializers.JSONField(allow_null=True)
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()


class ReplyInput(Shape):
    payload = serializers.JSONField(required=False, default=None)
    error = serializers.JSONField(required=False, default=None, help_text="Fails the request.")


# ReplyInput as the OpenAPI document shows it: one of these two, never both.
class ReplyPayloadInput(Shape):
    """A reply that completes the request."""

    payload = serializers.JSONField(help_text="The answer, any JSON value but null.")


class ReplyErrorInput(Shape):
    """A reply that fails the request."""

    error = serializers.JSONField(help_text="Why, any JSON value but null (such as {code, message}).")


class RequestStatusOutput(Shape):
    request_id = serializers.CharField(source="pk")
    status = one_of(AgentRequest.Status.choices)


# --- steering ------------------------------------------------------------------------------------


class SteeringItemOutput(Shape):
    seq = serializers.IntegerField()
    kind = one_of(SteeringItem.Kind.choices)
    request_id = serializers.SerializerMethodField()
    from_ = serializers.CharField(source="sender")
    type = serializers.CharField(source="request.type", allow_null=True)
    payload = serializers.JSONField(allow_null=True)
    status = serializers.SerializerMethodField()
    error = serializers.SerializerMethodField()
    created_at = serializers.DateTimeField()

    OPTIONAL = ("status", "error")

    @extend_schema_field(serializers.CharField(allow_null=True, help_text="req-… (hreq-… for a human_response)"))
    def get_request_id(self, item: SteeringItem) -> str | None:
        return item.request_id or item.human_request_id

    @extend_schema_field(serializers.CharField(required=False, help_text="The request's status (responses, notices)."))
    def get_status(self, item: SteeringItem) -> str | None:
        if item.request is None or item.kind not in (SteeringItem.Kind.RESPONSE, SteeringItem.Kind.NOTICE):
            return None
        return item.request.status

    @extend_schema_field(serializers.JSONField(required=False, help_text="A failed request's error."))
    def get_error(self, item: SteeringItem) -> Any:
        if item.request is None or item.kind not in (SteeringItem.Kind.RESPONSE, SteeringItem.Kind.NOTICE):
            return None
        return item.request.error

    def to_representation(self, instance: Any) -> dict[str, Any]:
        data: dict[str, Any] = super().to_representation(instance)
        for name in self.OPTIONAL:
            if data.get(name) is None:
                data.pop(name, None)
        return data


class SteeringOutput(Shape):
    items = SteeringItemOutput(many=True)


# --- runs ----------------------------------------------------------------------------------------


class RunStatusInput(Shape):
    status = serializers.ChoiceField(choices=["working", "idle", "finished"])


class RunStatusOutput(Shape):
    run_id = serializers.CharField(source="pk")
    status = one_of(Run.Status.choices)
    worker = serializers.CharField(
        help_text="Node name of the Celery worker that took the run's latest turn; empty for external agents."
    )


# --- forms for people (ask_human) ----------------------------------------------------------------


class FormFieldSpec(Shape):
    name = serializers.CharField(max_length=64)
    label_ = serializers.CharField(required=False, allow_blank=True)
    type = serializers.ChoiceField(choices=FIELD_TYPES, default="text")
    required_ = serializers.BooleanField(default=True)
    choices = serializers.ListField(child=serializers.CharField(), required=False)


@extend_schema_field({"type": "array", "items": {"$ref": "#/components/schemas/FormFieldSpec"}, "minItems": 1,
                      "maxItems": 50})  # fmt: skip
class FormFieldsField(serializers.JSONField):
    """The form's fields, checked (with per-field errors) by the kernel rather than here."""


class HumanRequestCreateInput(Shape):
    to = serializers.CharField(
        max_length=160, required=False, allow_null=True, default=None, help_text="human:<name>; the owner if omitted."
    )
    title = serializers.CharField(max_length=200)
    fields_ = FormFieldsField()


class HumanRequestCreatedOutput(Shape):
    human_request_id = serializers.CharField(source="pk")
    status = one_of(HumanRequest.Status.choices)


class HumanRequestOutput(Shape):
    human_request_id = serializers.CharField(source="pk")
    saga_id = serializers.UUIDField()
    from_ = serializers.CharField(source="asker.handle")
    to = serializers.CharField(source="addressee.handle")
    title = serializers.CharField()
    fields_ = FormFieldSpec(many=True)
    status = one_of(HumanRequest.Status.choices)
    answer = serializers.JSONField(allow_null=True)
    created_at = serializers.DateTimeField()
    answered_at = serializers.DateTimeField(allow_null=True)


class HumanRequestListOutput(Shape):
    human_requests = HumanRequestOutput(many=True)


class HumanAnswerInput(Shape):
    answer = serializers.DictField(
        child=serializers.JSONField(), help_text="{field name: value}, checked against the form."
    )


# --- the journal ---------------------------------------------------------------------------------


class JournalEventOutput(Shape):
    seq = serializers.IntegerField()
    type = serializers.CharField()
    actor = serializers.CharField()
    run_id = serializers.CharField(allow_null=True)
    data_ = serializers.JSONField()
    created_at = serializers.DateTimeField()


class JournalPageOutput(Shape):
    events = JournalEventOutput(many=True)
