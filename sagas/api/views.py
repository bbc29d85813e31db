"""The REST API of DESIGN.md §6: one view per operation, each parsing its input, fetching what the
caller may see, calling a kernel action and serializing the result.

Every lookup is scoped to the caller, and to an outsider a saga, request or form that exists looks
exactly like one that does not (404 `not_found`). Views that may wait (`ask_agent` with
`mode=wait`, the steering long-poll) return a `WaitingResponse`; `sagas.api.waiting` serves them
from async views.

This module holds sagas, collaborators, runs and the journal, and the helpers every API module
shares; requests between agents and the steering feed are in `requests`, forms for people in
`human_requests`, and teams, tokens and artifacts in their own modules.
"""

from typing import Any
from uuid import UUID

from django.urls import reverse
from django.utils.cache import add_never_cache_headers
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, PolymorphicProxySerializer, extend_schema
from rest_framework import exceptions, serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.models import User
from config import openapi
from config.openapi import IDEMPOTENCY_KEY
from config.params import created_headers, idempotency_key, integer_param
from config.parsers import LimitedJSONParser
from journal.models import JournalEvent
from sagas import actions, errors
from sagas.access import JournalLens, collaborator_card, collaborator_for, may_manage, visible_collaborators
from sagas.api import serializers as s
from sagas.models import Collaborator, Run, Saga

STEERING_PAGE = 200  # items per steering response; the client pages on with `after`
JOURNAL_PAGE = 500  # events per journal response
LIST_LIMIT = 500


problems = openapi.problems
AFTER = {"type": "integer", "minimum": 0, "maximum": openapi.MAX_QUERY_INT}  # a seq cursor


def principal(request: Request) -> User:
    """The authenticated caller (every view here requires one)."""
    if not isinstance(request.user, User):
        raise exceptions.NotAuthenticated()
    return request.user


def valid(serializer_class: type[serializers.Serializer], data: Any) -> dict[str, Any]:
    serializer = serializer_class(data=data)
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)


def visible_saga(user: Any, saga_id: UUID) -> Saga:
    saga = Saga.objects.visible_to(user).select_related("owner").filter(pk=saga_id).first()
    if saga is None:
        raise errors.NotFound(f"No saga {saga_id}.")
    return saga


def created_or_replayed(data: Any, created: bool, *, location: str = "") -> Response:
    """A create's answer: 201, or for a replay of its Idempotency-Key the first one's body with 200
    and `Idempotent-Replayed: true`; both with the created resource's address (`location`), if it
    has one of its own."""
    return Response(data, status=201 if created else 200, headers=created_headers(location, created))


def cursor_param(request: Request) -> int:
    return integer_param(request.query_params, "after", default=0)


def limit_param(request: Request, *, limit: int) -> int:
    return min(integer_param(request.query_params, "limit", default=limit, minimum=1), limit)


class ApiView(APIView):
    parser_classes = [LimitedJSONParser]
    # Who calls each method ("person", "agent"), for the OpenAPI security (accounts.api.TokenScheme).
    callers: dict[str, tuple[str, ...]] = {}


# --- sagas ---------------------------------------------------------------------------------------


class SagaListApi(ApiView):
    @extend_schema(operation_id="sagas_list", responses={200: s.SagaListOutput, **problems(401)})
    def get(self, request: Request) -> Response:
        """The sagas the caller may see."""
        sagas = Saga.objects.visible_to(principal(request)).select_related("owner")[:LIST_LIMIT]
        return Response(s.SagaListOutput({"sagas": sagas}).data)


class SagaCreateApi(ApiView):
    @extend_schema(
        operation_id="sagas_create",
        parameters=[IDEMPOTENCY_KEY],
        request=s.SagaCreateInput,
        responses={
            201: s.SagaOutput,
            200: OpenApiResponse(s.SagaOutput, description="A replay of an Idempotency-Key."),
            **problems(400, 401, 403, 409),
        },
    )
    def post(self, request: Request) -> Response:
        """Create a saga; the caller becomes its owner, `human:<username>`."""
        if principal(request).is_agent:
            raise errors.Forbidden("Agents work inside sagas; people create them.")
        data = valid(s.SagaCreateInput, request.data)
        saga, created = actions.create_saga_once(
            title=data["title"], goal=data["goal"], policy=data["policy"], owner=principal(request),
            idempotency_key=idempotency_key(request.headers),
        )  # fmt: skip
        return created_or_replayed(s.SagaOutput(saga).data, created, location=reverse("api-saga", args=[saga.pk]))


class SagaCollectionApi(SagaListApi, SagaCreateApi):
    """`/sagas/`: two operations at one address."""


class SagaDetailApi(ApiView):
    @extend_schema(operation_id="sagas_retrieve", responses={200: s.SagaOutput, **problems(401, 404)})
    def get(self, request: Request, saga_id: UUID) -> Response:
        return Response(s.SagaOutput(visible_saga(principal(request), saga_id)).data)


class SagaFinishApi(ApiView):
    callers = {"post": ("person",)}

    @extend_schema(
        operation_id="sagas_finish",
        request=s.SagaFinishInput,
        responses={200: s.SagaOutput, **problems(400, 401, 403, 404, 409)},
    )
    def post(self, request: Request, saga_id: UUID) -> Response:
        """A manager finishes the saga, `completed` or `cancelled`: its teams are shut down, its runs
        still at work cancelled, its open requests and forms closed; then it takes no new work
        (`saga_finished`, 409) and stays readable. Again with the same status: unchanged, 200."""
        saga = visible_saga(principal(request), saga_id)
        if not may_manage(principal(request), saga):  # like every manager operation: 403 before parsing
            raise errors.Forbidden("Only managers of the saga finish it.")
        data = valid(s.SagaFinishInput, request.data)
        saga = actions.finish_saga(saga=saga, status=data["status"], reason=data["reason"], by=principal(request))
        return Response(s.SagaOutput(saga).data)


# --- collaborators -------------------------------------------------------------------------------


class CollaboratorListApi(ApiView):
    @extend_schema(operation_id="collaborators_list", responses={200: s.CollaboratorListOutput, **problems(401, 404)})
    def get(self, request: Request, saga_id: UUID) -> Response:
        """`get_collaborators()` as the caller sees it: an agent sees its part of the tree, people see everyone."""
        saga = visible_saga(principal(request), saga_id)
        caller = collaborator_for(principal(request), saga)
        if caller is not None and caller.is_agent:
            members = visible_collaborators(caller)
        else:
            members = list(Collaborator.objects.filter(saga=saga).select_related("run"))
        return Response(s.CollaboratorListOutput({"collaborators": [collaborator_card(c) for c in members]}).data)


class CollaboratorAddApi(ApiView):
    @extend_schema(
        operation_id="collaborators_create",
        request=PolymorphicProxySerializer(
            component_name="CollaboratorAddInput",
            serializers={"agent": s.AgentAddInput, "human": s.HumanAddInput},
            resource_type_field_name="kind",
        ),
        parameters=[IDEMPOTENCY_KEY],
        responses={
            201: s.CollaboratorAddedOutput,
            200: OpenApiResponse(
                s.CollaboratorAddedOutput,
                description="A replay of an Idempotency-Key: the first one's collaborator, without a token (an "
                "external agent's is in the first answer only; a lost one is replaced by a rotation).",
            ),
            **problems(400, 401, 403, 404, 409, 429),
        },
    )
    def post(self, request: Request, saga_id: UUID) -> Response:
        """Add an agent (managers anywhere; an agent only its own delegates) or a person (managers).

        An external agent's token is in this response and nowhere else, ever: a retry with the same
        Idempotency-Key answers without it (a manager rotates a lost one: `.../token/`).
        """
        saga = visible_saga(principal(request), saga_id)
        kind = request.data.get("kind") if isinstance(request.data, dict) else None
        key = idempotency_key(request.headers)
        if kind == Collaborator.Kind.AGENT:
            agent = valid(s.AgentAddInput, request.data)
            new = actions.NewAgent(
                name=agent["name"], role=agent["role"], task=agent["task"], runtime=agent["runtime"],
                profile=agent["profile"], resumable=agent["resumable"],
            )  # fmt: skip
            collaborator, token, created = actions.add_agent_once(
                saga=saga, agent=new, parent=agent["parent"], by=principal(request), idempotency_key=key
            )
            card = collaborator_card(collaborator) | ({"token": token} if token else {})
        elif kind == Collaborator.Kind.HUMAN:
            human = valid(s.HumanAddInput, request.data)
            if not may_manage(principal(request), saga):  # before the lookup: usernames are not for everyone
                raise errors.Forbidden("Only managers of the saga add collaborators.")
            person = User.objects.filter(username=human["username"], kind=User.Kind.HUMAN, is_active=True).first()
            if person is None:
                raise errors.NotFound("No such person.", errors={"username": ["No such person."]})
            collaborator, created = actions.add_human_once(
                saga=saga, user=person, role=human["role"], task=human["task"], by=principal(request),
                idempotency_key=key,
            )  # fmt: skip
            card = collaborator_card(collaborator)
        else:
            raise exceptions.ValidationError({"kind": ["agent or human."]})
        response = created_or_replayed(s.CollaboratorAddedOutput(card).data, created)
        if "token" in card:
            add_never_cache_headers(response)  # the token must stay out of every cache (no-store)
        return response


class CollaboratorCollectionApi(CollaboratorListApi, CollaboratorAddApi):
    """`/sagas/{id}/collaborators/`: two operations at one address."""


class CollaboratorSteerApi(ApiView):
    callers = {"post": ("person",)}

    @extend_schema(
        operation_id="collaborators_steer",
        parameters=[IDEMPOTENCY_KEY],
        request=s.SteerInput,
        responses={
            201: s.SteerOutput,
            200: OpenApiResponse(s.SteerOutput, description="A replay of an Idempotency-Key."),
            **problems(400, 401, 403, 404, 409, 413, 429),
        },
    )
    def post(self, request: Request, saga_id: UUID, cid: str) -> Response:
        """A manager's message to an agent (`cid` such as agent:coder-01), read at its next turn boundary.

        A retry with the same Idempotency-Key and message is not delivered again: it answers the
        first one's body with 200 and `Idempotent-Replayed: true`."""
        saga = visible_saga(principal(request), saga_id)
        if not may_manage(principal(request), saga):  # before the lookup: who exists is not for everyone
            raise errors.Forbidden("Only managers of the saga steer its agents.")
        to = actions.find_collaborator(saga, cid)
        if to is None:
            raise errors.NotFound(f"No collaborator {cid} in this saga.")
        message = valid(s.SteerInput, request.data)["message"]
        item, created = actions.steer(
            saga=saga, to=to, message=message, by=principal(request), idempotency_key=idempotency_key(request.headers)
        )
        return created_or_replayed(s.SteerOutput({"to": to.handle, "seq": item.seq}).data, created)


class CollaboratorExposureApi(ApiView):
    @extend_schema(
        operation_id="collaborators_expose",
        request=s.ExposureInput,
        responses={200: s.ExposureOutput, **problems(400, 401, 403, 404, 409)},
    )
    def post(self, request: Request, saga_id: UUID, cid: str) -> Response:
        """A manager exposes an agent to A2A clients (`/a2a/<saga>/<agent>/`), or withdraws it."""
        saga = visible_saga(principal(request), saga_id)
        exposed = valid(s.ExposureInput, request.data)["exposed"]
        agent = actions.set_exposed(saga=saga, handle=cid, exposed=exposed, by=principal(request))
        return Response(s.ExposureOutput({"id": agent.handle, "exposed": agent.exposed}).data)


# --- runs ----------------------------------------------------------------------------------------


class RunStatusApi(ApiView):
    callers = {"post": ("agent",)}

    @extend_schema(operation_id="runs_status_read", responses={200: s.RunStatusOutput, **problems(401, 404)})
    def get(self, request: Request, run_id: str) -> Response:
        """A run's state and the worker that took its latest turn: for the agent itself and the
        saga's managers (to anyone else it does not exist)."""
        user = principal(request)
        run = Run.objects.select_related("collaborator__saga").filter(pk=run_id).first()
        if run is None or not (run.collaborator.user_id == user.pk or may_manage(user, run.collaborator.saga)):
            raise errors.NotFound(f"No run {run_id}.")
        return Response(s.RunStatusOutput(run).data)

    @extend_schema(
        operation_id="runs_status",
        request=s.RunStatusInput,
        responses={200: s.RunStatusOutput, **problems(400, 401, 403, 404, 409)},
    )
    def post(self, request: Request, run_id: str) -> Response:
        """An external agent reports on its own run; `finished` fails the requests still waiting on it."""
        status = valid(s.RunStatusInput, request.data)["status"]
        run = actions.set_external_status(run_id=run_id, status=status, by=principal(request))
        return Response(s.RunStatusOutput(run).data)


# --- the journal ---------------------------------------------------------------------------------


class JournalEventListApi(ApiView):
    @extend_schema(
        operation_id="journal_list",
        parameters=[
            OpenApiParameter("after", AFTER, description="Events with a greater seq."),
            OpenApiParameter(
                "limit",
                {"type": "integer", "minimum": 1, "maximum": openapi.MAX_QUERY_INT},
                description=f"At most {JOURNAL_PAGE} (more is cut to that).",
            ),
        ],
        responses={200: s.JournalPageOutput, **problems(400, 401, 404)},
    )
    def get(self, request: Request, saga_id: UUID) -> Response:
        """The events after a cursor the caller may see, in seq order; page on with the last seq seen.

        Managers see every event; anyone else the events of the collaborators they see and of the
        requests, forms and messages they are party to (README, "Who sees what").
        """
        after, limit = cursor_param(request), limit_param(request, limit=JOURNAL_PAGE)
        saga = visible_saga(principal(request), saga_id)
        lens = JournalLens(principal(request), saga)
        events, _ = lens.take(JournalEvent.objects.for_saga(saga.pk, after=after), limit)
        return Response(s.JournalPageOutput({"events": [event.as_dict() for event in events]}).data)


class ApiNotFound(ApiView):
    """Anything else under /api/v1/: a problem, not an HTML page (after authentication, like the rest)."""

    schema = None

    def dispatch_404(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        raise errors.NotFound("No such endpoint.")

    get = post = put = patch = delete = dispatch_404
