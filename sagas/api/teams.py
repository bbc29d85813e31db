"""The REST API of teams: spawn a teammate, read the roster and the lead's inbox, broadcast, shut a
teammate down. `{lead}` is the lead's id (agent:<name>). The lead itself (an external agent with
its token) or a manager of the saga directs the team; its teammates may read it too."""

from typing import Any
from uuid import UUID

from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_field
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from config.openapi import IDEMPOTENCY_KEY
from config.params import idempotency_key
from sagas import actions, errors
from sagas.access import collaborator_card
from sagas.api.serializers import CollaboratorOutput, Shape, one_of
from sagas.api.views import ApiView, created_or_replayed, principal, problems, valid, visible_saga
from sagas.models import Collaborator, Saga, SteeringItem, Team

INBOX_PAGE = 200


class TeammateSpawnInput(Shape):
    name = serializers.CharField(max_length=64)
    role = serializers.CharField(max_length=120, allow_blank=True, required=False, default="")
    profile = serializers.CharField(max_length=64, help_text="The internal teammate's agent profile.")
    prompt = serializers.CharField(help_text="Its first task; it idles when done, until it is sent more.")


class TeammateOutput(Shape):
    id = serializers.CharField()
    role = serializers.CharField()
    status = serializers.ChoiceField(choices=["working", "idle", "waiting", "shutdown"])
    run_status = serializers.CharField()
    run_id = serializers.CharField()
    current_task = serializers.CharField()
    turns = serializers.IntegerField()
    tokens = serializers.IntegerField()
    last_activity = serializers.DateTimeField()
    reason = serializers.CharField(
        help_text="Why it ended, once it has (`team_budget_exhausted: …` when its team ran out of tokens)."
    )


class TeamOutput(Shape):
    lead = serializers.CharField()
    max_teammates = serializers.IntegerField()
    max_tokens = serializers.IntegerField()
    idle_timeout_s = serializers.FloatField()
    tokens_used = serializers.IntegerField()
    teammates = TeammateOutput(many=True)


class TeamBudgetsInput(Shape):
    max_teammates = serializers.IntegerField(min_value=0, max_value=actions.BUDGET_MAX["max_teammates"], required=False)
    max_tokens = serializers.IntegerField(min_value=0, max_value=actions.BUDGET_MAX["max_tokens"], required=False)
    idle_timeout_s = serializers.FloatField(
        min_value=0, max_value=actions.BUDGET_MAX["idle_timeout_s"], required=False, help_text="0: never."
    )


class BroadcastInput(Shape):
    content = serializers.JSONField(help_text="Usually text; any JSON value.")


class BroadcastOutput(Shape):
    broadcast_id = serializers.CharField(source="pk")
    sender = serializers.CharField()
    recipients = serializers.ListField(child=serializers.CharField())
    content = serializers.JSONField()
    created_at = serializers.DateTimeField()


class ShutdownInput(Shape):
    reason = serializers.CharField(max_length=500, allow_blank=True, required=False, default="")


class ShutdownOutput(Shape):
    id = serializers.CharField()
    run_id = serializers.CharField()
    status = serializers.CharField(help_text="shutdown, or how it had already ended.")


class InboxItemOutput(Shape):
    seq = serializers.IntegerField()
    kind = one_of(SteeringItem.Kind.choices)
    from_ = serializers.CharField(source="sender")
    request_id = serializers.CharField(allow_null=True)
    type = serializers.SerializerMethodField()
    payload = serializers.JSONField(allow_null=True)
    read = serializers.SerializerMethodField()
    created_at = serializers.DateTimeField()

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_type(self, item: SteeringItem) -> str | None:
        return item.request.type if item.request is not None else None

    @extend_schema_field(serializers.BooleanField(help_text="Whether the lead has read it (at a turn, or acked)."))
    def get_read(self, item: SteeringItem) -> bool:
        return item.consumed_at is not None


class InboxOutput(Shape):
    lead = serializers.CharField()
    unread = serializers.IntegerField()
    items = InboxItemOutput(many=True)


def lead_of(saga: Saga, lead: str) -> Collaborator:
    found = actions.find_collaborator(saga, lead)
    if found is None or not found.is_agent:
        raise errors.NotFound(f"No agent {lead} in this saga.")
    return found


def team_data(team: Team) -> Any:
    mates = actions.roster(team)
    return TeamOutput(
        {"lead": team.lead.handle, "max_teammates": team.max_teammates, "max_tokens": team.max_tokens,
         "idle_timeout_s": team.idle_timeout_s, "tokens_used": sum(m.tokens for m in mates), "teammates": mates}
    ).data  # fmt: skip


class TeamDetailApi(ApiView):
    @extend_schema(operation_id="teams_retrieve", responses={200: TeamOutput, **problems(401, 404)})
    def get(self, request: Request, saga_id: UUID, lead: str) -> Response:
        """The roster: each teammate's status (working, idle, waiting, shutdown), task, turns, tokens, last activity."""
        saga = visible_saga(principal(request), saga_id)
        return Response(team_data(actions.visible_team(saga, lead, principal(request))))

    @extend_schema(
        operation_id="teams_configure",
        request=TeamBudgetsInput,
        responses={200: TeamOutput, **problems(400, 401, 403, 404)},
    )
    def patch(self, request: Request, saga_id: UUID, lead: str) -> Response:
        """A manager sets the team's budgets (creating the team if `lead` has none yet)."""
        saga = visible_saga(principal(request), saga_id)
        budgets = valid(TeamBudgetsInput, request.data)
        team = actions.configure_team(lead=lead_of(saga, lead), by=principal(request), **budgets)
        return Response(team_data(team))


class TeammateSpawnApi(ApiView):
    @extend_schema(
        operation_id="teams_spawn",
        request=TeammateSpawnInput,
        parameters=[IDEMPOTENCY_KEY],
        responses={
            201: CollaboratorOutput,
            200: OpenApiResponse(CollaboratorOutput, description="A replay of an Idempotency-Key."),
            **problems(400, 401, 403, 404, 409),
        },
    )
    def post(self, request: Request, saga_id: UUID, lead: str) -> Response:
        """Spawn a persistent internal teammate under `lead` (`team_full`, `team_budget_exhausted` past its budgets)."""
        saga = visible_saga(principal(request), saga_id)
        data = valid(TeammateSpawnInput, request.data)
        mate, created = actions.spawn_teammate(
            lead=lead_of(saga, lead), name=data["name"], role=data["role"] or data["profile"], prompt=data["prompt"],
            profile=data["profile"], by=principal(request), idempotency_key=idempotency_key(request.headers),
        )  # fmt: skip
        mate.refresh_from_db()
        return created_or_replayed(CollaboratorOutput(collaborator_card(mate)).data, created)


class BroadcastCreateApi(ApiView):
    @extend_schema(
        operation_id="teams_broadcast",
        request=BroadcastInput,
        parameters=[IDEMPOTENCY_KEY],
        responses={
            201: BroadcastOutput,
            200: OpenApiResponse(BroadcastOutput, description="A replay of an Idempotency-Key."),
            **problems(400, 401, 403, 404, 409, 413, 429),
        },
    )
    def post(self, request: Request, saga_id: UUID, lead: str) -> Response:
        """One message to every teammate at work, in one transaction."""
        saga = visible_saga(principal(request), saga_id)
        team = actions.team_of(saga, lead)  # anyone who sees the saga sees its agents: not_team_lead, not 404
        content = valid(BroadcastInput, request.data)["content"]
        sent, created = actions.broadcast(
            lead=team.lead, content=content, by=principal(request), idempotency_key=idempotency_key(request.headers)
        )
        return created_or_replayed(BroadcastOutput(sent).data, created)


class TeammateShutdownApi(ApiView):
    @extend_schema(
        operation_id="teams_shutdown",
        request=ShutdownInput,
        responses={200: ShutdownOutput, **problems(400, 401, 403, 404)},
    )
    def post(self, request: Request, saga_id: UUID, lead: str, cid: str) -> Response:
        """End a teammate for good; what it was asked fails with `recipient_unavailable`. Idempotent."""
        saga = visible_saga(principal(request), saga_id)
        team = actions.team_of(saga, lead)
        reason = valid(ShutdownInput, request.data)["reason"] or "Shut down."
        run = actions.shutdown_teammate(teammate=actions.find_teammate(team, cid), reason=reason, by=principal(request))
        return Response(ShutdownOutput({"id": cid, "run_id": run.pk, "status": run.status}).data)


class InboxApi(ApiView):
    @extend_schema(operation_id="teams_inbox", responses={200: InboxOutput, **problems(401, 404)})
    def get(self, request: Request, saga_id: UUID, lead: str) -> Response:
        """What teammates sent the lead, newest first, with whether the lead has read each item."""
        saga = visible_saga(principal(request), saga_id)
        team = actions.visible_team(saga, lead, principal(request))
        items, unread = actions.lead_inbox(team, limit=INBOX_PAGE)
        return Response(InboxOutput({"lead": team.lead.handle, "unread": unread, "items": items}).data)
