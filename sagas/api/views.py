"""The REST API of DESIGN.md §6: one view per operation, each parsing its input, fetching what the
caller may see, calling a kernel action and serializing the result.

Every lookup is scoped to the caller, and to an outsider a saga, request or form that exists looks
exactly like one that does not (404 `not_found`). Views that may wait (`ask_agent` with
`mode=wait`, the steering long-poll) return a `WaitingResponse`; `sagas.api.waiting` serves them
from async views.
"""

import time
from functools import partial
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db.models import QuerySet
from django.utils import timezone
from django.utils.cache import add_never_cache_headers
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, PolymorphicProxySerializer, extend_schema
from rest_framework import exceptions, serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.models import User
from config.params import integer_param, seconds_param
from config.parsers import LimitedJSONParser
from journal.models import JournalEvent
from sagas import actions, errors
from sagas.access import JournalLens, collaborator_card, collaborator_for, may_manage, visible_collaborators
from sagas.api import serializers as s
from sagas.api.waiting import Done, Wait, WaitingResponse
from sagas.models import AgentRequest, Collaborator, HumanRequest, Saga, SteeringItem
from sagas.waits import hold_wait
from sagas.wakeups import request_channel, steering_channel

STEERING_PAGE = 200  # items per steering response; the client pages on with `after`
JOURNAL_PAGE = 500  # events per journal response
LIST_LIMIT = 500


def problems(*statuses: int) -> dict[tuple[int, str], OpenApiResponse]:
    """The error responses an operation documents, all `application/problem+json`."""
    problem = OpenApiResponse(s.ProblemOutput, description="A problem with a stable `code`.")
    return {(status, "application/problem+json"): problem for status in statuses}


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


def idempotency_key(request: Request) -> str:
    key = request.headers.get("Idempotency-Key", "").strip()
    if len(key) > 200:
        raise exceptions.ValidationError({"Idempotency-Key": ["At most 200 characters."]})
    return key


def cursor_param(request: Request) -> int:
    return integer_param(request.query_params, "after", default=0)


def limit_param(request: Request, *, limit: int) -> int:
    return min(integer_param(request.query_params, "limit", default=limit, minimum=1), limit)


IDEMPOTENCY_KEY = OpenApiParameter(
    "Idempotency-Key",
    OpenApiTypes.STR,
    OpenApiParameter.HEADER,
    description="Retries with the same key and body return the first result; another body → 409.",
)


class ApiView(APIView):
    parser_classes = [LimitedJSONParser]


# --- sagas ---------------------------------------------------------------------------------------


class SagaListApi(ApiView):
    @extend_schema(operation_id="sagas_list", responses={200: s.SagaListOutput, **problems(401)})
    def get(self, request: Request) -> Response:
        """The sagas the caller may see."""
        sagas = Saga.objects.visible_to(principal(request)).select_related("owner")[:LIST_LIMIT]
        return Response(s.SagaListOutput({"sagas": sagas}).data)


class SagaCreateApi(ApiView):
    @extend_schema(
        operation_id="sagas_create", request=s.SagaCreateInput, responses={201: s.SagaOutput, **problems(400, 401, 403)}
    )
    def post(self, request: Request) -> Response:
        """Create a saga; the caller becomes its owner, `human:<username>`."""
        if principal(request).is_agent:
            raise errors.Forbidden("Agents work inside sagas; people create them.")
        data = valid(s.SagaCreateInput, request.data)
        saga = actions.create_saga(
            title=data["title"], goal=data["goal"], policy=data["policy"], owner=principal(request)
        )
        return Response(s.SagaOutput(saga).data, status=201)


class SagaCollectionApi(SagaListApi, SagaCreateApi):
    """`/sagas/`: two operations at one address."""


class SagaDetailApi(ApiView):
    @extend_schema(operation_id="sagas_retrieve", responses={200: s.SagaOutput, **problems(401, 404)})
    def get(self, request: Request, saga_id: UUID) -> Response:
        return Response(s.SagaOutput(visible_saga(principal(request), saga_id)).data)


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
        responses={201: s.CollaboratorAddedOutput, **problems(400, 401, 403, 404, 409, 429)},
    )
    def post(self, request: Request, saga_id: UUID) -> Response:
        """Add an agent (managers anywhere; an agent only its own delegates) or a person (managers).

        An external agent's token is in this response and nowhere else, ever.
        """
        saga = visible_saga(principal(request), saga_id)
        kind = request.data.get("kind") if isinstance(request.data, dict) else None
        if kind == Collaborator.Kind.AGENT:
            agent = valid(s.AgentAddInput, request.data)
            collaborator, token = actions.add_agent(
                saga=saga, name=agent["name"], role=agent["role"], task=agent["task"], runtime=agent["runtime"],
                profile=agent["profile"], parent=agent["parent"], resumable=agent["resumable"], by=principal(request),
            )  # fmt: skip
            card = collaborator_card(collaborator) | ({"token": token} if token else {})
        elif kind == Collaborator.Kind.HUMAN:
            human = valid(s.HumanAddInput, request.data)
            if not may_manage(principal(request), saga):  # before the lookup: usernames are not for everyone
                raise errors.Forbidden("Only managers of the saga add collaborators.")
            person = User.objects.filter(username=human["username"], kind=User.Kind.HUMAN, is_active=True).first()
            if person is None:
                raise errors.InvalidPayload("No such person.", errors={"username": ["No such person."]})
            collaborator = actions.add_human(
                saga=saga, user=person, role=human["role"], task=human["task"], by=principal(request)
            )
            card = collaborator_card(collaborator)
        else:
            raise exceptions.ValidationError({"kind": ["agent or human."]})
        response = Response(s.CollaboratorAddedOutput(card).data, status=201)
        if "token" in card:
            add_never_cache_headers(response)  # the token must stay out of every cache (no-store)
        return response


class CollaboratorCollectionApi(CollaboratorListApi, CollaboratorAddApi):
    """`/sagas/{id}/collaborators/`: two operations at one address."""


class CollaboratorSteerApi(ApiView):
    @extend_schema(
        operation_id="collaborators_steer",
        request=s.SteerInput,
        responses={201: s.SteerOutput, **problems(400, 401, 403, 404, 413, 429)},
    )
    def post(self, request: Request, saga_id: UUID, cid: str) -> Response:
        """A manager's message to an agent (`cid` such as agent:coder-01), read at its next turn boundary."""
        saga = visible_saga(principal(request), saga_id)
        if not may_manage(principal(request), saga):  # before the lookup: who exists is not for everyone
            raise errors.Forbidden("Only managers of the saga steer its agents.")
        to = actions.find_collaborator(saga, cid)
        if to is None:
            raise errors.NotFound(f"No collaborator {cid} in this saga.")
        message = valid(s.SteerInput, request.data)["message"]
        item = actions.steer(saga=saga, to=to, message=message, by=principal(request))
        return Response(s.SteerOutput({"to": to.handle, "seq": item.seq}).data, status=201)


# --- requests between agents ---------------------------------------------------------------------


def outcome_data(request: AgentRequest) -> Any:
    return s.AskOutcomeOutput(actions.outcome(request)).data


def timed_out_data(request_id: str) -> Any:
    return s.AskPendingOutput({"request_id": request_id, "status": "pending", "timed_out": True}).data


def reply_check(request_id: str) -> Done | float:
    """One look at a request someone waits on over HTTP: its outcome, or how long the wait may last.

    The wait lasts until the request's `wait_deadline`, the waits-for edge in the database; when
    that passes (or the reconciler already ended it), the edge is removed and the caller gets
    `timed_out`, while the request itself stays open for a later reply through steering. A caller
    that hangs up leaves the edge in place until that deadline: it asked to wait that long, and a
    retry with the same Idempotency-Key resumes the same wait.
    """
    request = AgentRequest.objects.select_related("recipient").get(pk=request_id)
    if not request.is_open:
        return Done(200, outcome_data(request))
    now = timezone.now()
    if request.wait_deadline is not None and request.wait_deadline > now:
        return (request.wait_deadline - now).total_seconds()
    actions.end_wait(request_id=request_id)
    request.refresh_from_db()
    if not request.is_open:  # answered at the last moment
        return Done(200, outcome_data(request))
    return Done(202, timed_out_data(request_id))


class AgentRequestCreateApi(ApiView):
    @extend_schema(
        operation_id="requests_create",
        request=s.AskInput,
        parameters=[IDEMPOTENCY_KEY],
        responses={
            200: OpenApiResponse(s.AskOutcomeOutput, description="mode=wait: the request ended within the wait."),
            202: OpenApiResponse(
                s.AskPendingOutput, description="mode=async: registered. mode=wait: `timed_out`, still pending."
            ),
            **problems(400, 401, 403, 404, 409, 413, 429),
        },
    )
    def post(self, request: Request, saga_id: UUID) -> Response:
        """`ask_agent`: a durable request from the calling agent to another agent of the saga.

        With `mode=wait` the call holds until the reply or `timeout_s` (bounded by the server's
        maximum); a wait that would close a cycle of waits is refused with `deadlock`.
        """
        saga = visible_saga(principal(request), saga_id)
        sender = collaborator_for(principal(request), saga)
        if sender is None:
            raise errors.Forbidden("Only agents of this saga ask its agents.")
        ask = valid(s.AskInput, request.data)
        key = idempotency_key(request)
        slot = hold_wait(sender) if ask["mode"] == AgentRequest.Mode.WAIT else None  # before anything is written
        try:
            ask_request, created = actions.ask_agent(
                sender=sender, to=ask["to"], type=ask["type"], payload=ask["payload"], mode=ask["mode"],
                timeout_s=ask["timeout_s"], idempotency_key=key,
            )  # fmt: skip
        except BaseException:
            if slot is not None:
                slot.release()
            raise
        headers = {} if created else {"Idempotent-Replayed": "true"}
        if ask_request.mode == AgentRequest.Mode.ASYNC:
            pending = s.AskPendingOutput({"request_id": ask_request.pk, "status": "pending"}).data
            return Response(pending, status=202, headers=headers)
        wait = Wait(channel=request_channel(ask_request.pk), check=partial(reply_check, ask_request.pk), slot=slot)
        response = WaitingResponse(timed_out_data(ask_request.pk), status=202, wait=wait)
        for name, value in headers.items():
            response[name] = value
        return response


class AgentRequestDetailApi(ApiView):
    @extend_schema(operation_id="requests_retrieve", responses={200: s.AgentRequestOutput, **problems(401, 404)})
    def get(self, request: Request, request_id: str) -> Response:
        """A request's state, reply or error: for its sender, its recipient and the saga's managers."""
        return Response(s.AgentRequestOutput(actions.get_request_for(principal(request), request_id)).data)


class AgentRequestReplyApi(ApiView):
    @extend_schema(
        operation_id="requests_reply",
        request=s.ReplyInput,
        responses={200: s.RequestStatusOutput, **problems(400, 401, 403, 404, 409, 413)},
    )
    def post(self, request: Request, request_id: str) -> Response:
        """The recipient's one reply: a `payload`, or an `error` that fails the request."""
        reply = valid(s.ReplyInput, request.data)
        answered = actions.reply_to_request(
            request_id=request_id, by=principal(request), payload=reply["payload"], error=reply["error"]
        )
        return Response(s.RequestStatusOutput(answered).data)


class AgentRequestCancelApi(ApiView):
    @extend_schema(
        operation_id="requests_cancel",
        request=None,
        responses={200: s.RequestStatusOutput, **problems(401, 403, 404, 409)},
    )
    def post(self, request: Request, request_id: str) -> Response:
        """The sender withdraws its request (idempotent); the recipient gets a notice."""
        cancelled = actions.cancel_request(request_id=request_id, by=principal(request))
        return Response(s.RequestStatusOutput(cancelled).data)


# --- steering ------------------------------------------------------------------------------------


def steering_after(recipient_id: int, after: int) -> QuerySet[SteeringItem]:
    items = SteeringItem.objects.filter(recipient_id=recipient_id, seq__gt=after).select_related("request")
    return items.order_by("seq")[:STEERING_PAGE]


def steering_check(recipient_id: int, after: int, until: float) -> Done | float:
    items = list(steering_after(recipient_id, after))
    left = until - time.monotonic()
    if items or left <= 0:
        return Done(200, s.SteeringOutput({"items": items}).data)
    return left


class SteeringFeedApi(ApiView):
    @extend_schema(
        operation_id="steering_list",
        parameters=[
            OpenApiParameter(
                "after", OpenApiTypes.INT, description="Items up to this seq are acknowledged (consumed)."
            ),
            OpenApiParameter("wait", OpenApiTypes.NUMBER, description="Long-poll up to this many seconds."),
        ],
        responses={200: s.SteeringOutput, **problems(400, 401, 403, 429)},
    )
    def get(self, request: Request) -> Response:
        """The calling agent's steering items after the cursor; waits up to `wait` seconds for one."""
        after = cursor_param(request)
        wait_s = min(seconds_param(request.query_params, "wait"), settings.AGORA_STEERING_POLL_MAX_S)
        me = Collaborator.objects.filter(user=principal(request), kind=Collaborator.Kind.AGENT).first()
        if me is None:
            raise errors.Forbidden("Only agents have steering.")
        if SteeringItem.objects.filter(recipient=me, seq__lte=after, consumed_at__isnull=True).exists():
            actions.consume_steering(recipient=me, upto_seq=after)
        items = list(steering_after(me.pk, after))
        if items or wait_s == 0:
            return Response(s.SteeringOutput({"items": items}).data)
        wait = Wait(
            channel=steering_channel(me.pk),
            check=partial(steering_check, me.pk, after, time.monotonic() + wait_s),
            slot=hold_wait(me),
        )
        return WaitingResponse({"items": []}, status=200, wait=wait)


# --- runs ----------------------------------------------------------------------------------------


class RunStatusApi(ApiView):
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


# --- forms for people (ask_human) ----------------------------------------------------------------


class HumanRequestCreateApi(ApiView):
    @extend_schema(
        operation_id="human_requests_create",
        request=s.HumanRequestCreateInput,
        parameters=[IDEMPOTENCY_KEY],
        responses={
            201: s.HumanRequestCreatedOutput,
            200: OpenApiResponse(s.HumanRequestCreatedOutput, description="A replay of an Idempotency-Key."),
            **problems(400, 401, 403, 404, 409, 429),
        },
    )
    def post(self, request: Request, saga_id: UUID) -> Response:
        """`ask_human`: a form for a person of the saga (the owner unless `to` says who)."""
        saga = visible_saga(principal(request), saga_id)
        asker = collaborator_for(principal(request), saga)
        if asker is None:
            raise errors.Forbidden("Only agents of this saga ask its people.")
        form = valid(s.HumanRequestCreateInput, request.data)
        human_request, created = actions.ask_human(
            asker=asker, title=form["title"], fields=form["fields"], to=form["to"],
            idempotency_key=idempotency_key(request),
        )  # fmt: skip
        return Response(s.HumanRequestCreatedOutput(human_request).data, status=201 if created else 200)


class HumanRequestListApi(ApiView):
    @extend_schema(
        operation_id="human_requests_list",
        parameters=[OpenApiParameter("status", OpenApiTypes.STR, enum=HumanRequest.Status.values)],
        responses={200: s.HumanRequestListOutput, **problems(400, 401)},
    )
    def get(self, request: Request) -> Response:
        """The forms addressed to the caller, oldest first."""
        forms = HumanRequest.objects.filter(addressee__user=principal(request)).select_related("asker", "addressee")
        if status := request.query_params.get("status"):
            if status not in HumanRequest.Status.values:
                raise exceptions.ValidationError({"status": [f"One of {HumanRequest.Status.values}."]})
            forms = forms.filter(status=status)
        listed = forms.order_by("created_at")[:LIST_LIMIT]
        return Response(s.HumanRequestListOutput({"human_requests": listed}).data)


class HumanRequestDetailApi(ApiView):
    @extend_schema(operation_id="human_requests_retrieve", responses={200: s.HumanRequestOutput, **problems(401, 404)})
    def get(self, request: Request, human_request_id: str) -> Response:
        """A form and its answer: for the person it is addressed to, the asking agent and managers."""
        form = HumanRequest.objects.select_related("saga", "asker", "addressee").filter(pk=human_request_id).first()
        if form is None or not actions.visible_human_request(form, principal(request)):
            raise errors.NotFound(f"No form {human_request_id}.")
        return Response(s.HumanRequestOutput(form).data)


class HumanRequestAnswerApi(ApiView):
    @extend_schema(
        operation_id="human_requests_answer",
        request=s.HumanAnswerInput,
        responses={200: s.HumanRequestOutput, **problems(400, 401, 403, 404, 409)},
    )
    def post(self, request: Request, human_request_id: str) -> Response:
        """The addressed person's answer, checked against the form (400 with `errors` per field)."""
        answer = valid(s.HumanAnswerInput, request.data)["answer"]
        form = actions.answer_human_request(human_request_id=human_request_id, answer=answer, by=principal(request))
        return Response(s.HumanRequestOutput(form).data)


# --- the journal ---------------------------------------------------------------------------------


class JournalEventListApi(ApiView):
    @extend_schema(
        operation_id="journal_list",
        parameters=[
            OpenApiParameter("after", OpenApiTypes.INT, description="Events with a greater seq."),
            OpenApiParameter("limit", OpenApiTypes.INT, description=f"At most {JOURNAL_PAGE}."),
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
