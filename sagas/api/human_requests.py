"""The REST API's forms for people (`ask_human`): ask, list, read, answer."""

from uuid import UUID

from django.urls import reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import exceptions
from rest_framework.request import Request
from rest_framework.response import Response

from config.openapi import IDEMPOTENCY_KEY
from config.params import idempotency_key
from sagas import actions, errors
from sagas.access import collaborator_for
from sagas.api import serializers as s
from sagas.api.views import (
    LIST_LIMIT,
    ApiView,
    created_or_replayed,
    principal,
    problems,
    valid,
    visible_saga,
)
from sagas.models import HumanRequest

# --- forms for people (ask_human) ----------------------------------------------------------------


class HumanRequestCreateApi(ApiView):
    callers = {"post": ("agent",)}

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
            idempotency_key=idempotency_key(request.headers),
        )  # fmt: skip
        return created_or_replayed(
            s.HumanRequestCreatedOutput(human_request).data, created,
            location=reverse("api-human-request", args=[human_request.pk]),
        )  # fmt: skip


class HumanRequestListApi(ApiView):
    callers = {"get": ("person",)}

    @extend_schema(
        operation_id="human_requests_list",
        parameters=[OpenApiParameter("status", OpenApiTypes.STR, enum=HumanRequest.Status.values)],
        responses={200: s.HumanRequestListOutput, **problems(400, 401)},
    )
    def get(self, request: Request) -> Response:
        """The forms addressed to the caller, oldest first."""
        forms = HumanRequest.objects.filter(addressee__user=principal(request)).select_related("asker", "addressee")
        if "status" in request.query_params:
            status = request.query_params["status"]
            if status not in HumanRequest.Status.values:
                raise exceptions.ValidationError({"status": [f"One of {HumanRequest.Status.values}."]})
            forms = forms.filter(status=status)
        listed = forms.order_by("created_at")[:LIST_LIMIT]
        return Response(s.HumanRequestListOutput({"human_requests": listed}).data)


class HumanRequestDetailApi(ApiView):
    callers = {"get": ("person",)}

    @extend_schema(operation_id="human_requests_retrieve", responses={200: s.HumanRequestOutput, **problems(401, 404)})
    def get(self, request: Request, human_request_id: str) -> Response:
        """A form and its answer: for the person it is addressed to, the asking agent and managers."""
        form = HumanRequest.objects.select_related("saga", "asker", "addressee").filter(pk=human_request_id).first()
        if form is None or not actions.visible_human_request(form, principal(request)):
            raise errors.NotFound(f"No form {human_request_id}.")
        return Response(s.HumanRequestOutput(form).data)


class HumanRequestAnswerApi(ApiView):
    callers = {"post": ("person",)}

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
