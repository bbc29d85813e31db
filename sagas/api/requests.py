"""The REST API's requests between agents (`ask_agent`, reply, cancel) and the steering feed;
the waits among them are served by `sagas.api.waiting`."""

import time
from functools import partial
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db.models import QuerySet
from django.urls import reverse
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, PolymorphicProxySerializer, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from config.openapi import IDEMPOTENCY_KEY
from config.params import created_headers, idempotency_key, seconds_param
from sagas import actions, errors
from sagas.access import collaborator_for
from sagas.api import serializers as s
from sagas.api.views import (
    AFTER,
    STEERING_PAGE,
    ApiView,
    cursor_param,
    principal,
    problems,
    valid,
    visible_saga,
)
from sagas.api.waiting import Done, Wait, WaitingResponse
from sagas.models import AgentRequest, Collaborator, SteeringItem
from sagas.waits import given_back_if_raised, hold_wait
from sagas.wakeups import request_channel, steering_channel

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
    callers = {"post": ("agent",)}

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
        key = idempotency_key(request.headers)
        slot = hold_wait(sender) if ask["mode"] == AgentRequest.Mode.WAIT else None  # before anything is written
        with given_back_if_raised(slot):
            ask_request, created = actions.ask_agent(
                sender=sender, to=ask["to"], type=ask["type"], payload=ask["payload"], mode=ask["mode"],
                timeout_s=ask["timeout_s"], idempotency_key=key,
            )  # fmt: skip
        headers = created_headers(reverse("api-request", args=[ask_request.pk]), created)  # where to follow it
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
    callers = {"post": ("agent",)}

    @extend_schema(
        operation_id="requests_reply",
        request=PolymorphicProxySerializer(
            component_name="ReplyInput",
            serializers=[s.ReplyPayloadInput, s.ReplyErrorInput],
            resource_type_field_name=None,
        ),
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
    callers = {"post": ("agent",)}

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
    callers = {"get": ("agent",)}

    @extend_schema(
        operation_id="steering_list",
        parameters=[
            OpenApiParameter(
                "after",
                AFTER,
                description="Items up to this seq are acknowledged (consumed); a cursor past "
                "your newest item is refused (400 `invalid_payload`).",
            ),
            OpenApiParameter(
                "wait",
                {"type": "number", "minimum": 0},
                description=f"Long-poll up to this many seconds (at most {settings.AGORA_STEERING_POLL_MAX_S:g}: "
                "more is cut to that).",
            ),
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
        items = list(steering_after(me.pk, after))
        slot = hold_wait(me) if wait_s and not items else None  # a wait's place, before anything is written
        with given_back_if_raised(slot):
            actions.acknowledge_steering(recipient=me, upto_seq=after)
        if slot is None:
            return Response(s.SteeringOutput({"items": items}).data)
        check = partial(steering_check, me.pk, after, time.monotonic() + wait_s)
        return WaitingResponse({"items": []}, status=200, wait=Wait(steering_channel(me.pk), check, slot=slot))
