"""`POST` and `GET /api/v1/sagas/{id}/prompts/`, `GET /api/v1/prompts/{prompt_id}/`, `POST
/api/v1/prompts/{prompt_id}/cancel/`: one view per operation, with the kernel's problem+json error
codes. Lookups are scoped to the caller: to an outsider a saga or prompt that exists looks exactly
like one that does not (404 `not_found`)."""

from typing import Any
from uuid import UUID

from django.urls import reverse
from drf_spectacular.utils import extend_schema
from rest_framework import exceptions, serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.models import User
from agents.orchestrator.actions import MAX_IMAGE_URL, MAX_IMAGES, check_may_prompt, submit_prompt
from agents.orchestrator.cancel import cancel_prompt
from agents.orchestrator.models import Prompt
from config.openapi import IDEMPOTENCY_KEY, Shape, problems
from config.params import created_headers, idempotency_key
from config.parsers import LimitedJSONParser
from sagas import errors
from sagas.models import Saga

PROMPTS_LISTED = 200


class PromptCreateInput(Shape):
    prompt = serializers.CharField(max_length=20_000, trim_whitespace=True)
    team = serializers.ListField(child=serializers.CharField(max_length=40), required=False, default=list)
    brain = serializers.CharField(max_length=64, required=False, default="", allow_blank=True)  # "": the default
    images = serializers.ListField(
        child=serializers.CharField(max_length=MAX_IMAGE_URL),
        required=False,
        default=list,
        max_length=MAX_IMAGES,
        help_text="http(s) URLs of images, for the roles whose models can see them (an uploaded image is an "
        "artifact: reference it in the prompt as @artifact:<name>).",
    )


class PromptCreatedOutput(serializers.Serializer):
    prompt_id = serializers.UUIDField()
    status = serializers.CharField(help_text="running")
    lead = serializers.CharField(help_text="The orchestration's lead collaborator, agent:brain-….")


class PromptSummaryOutput(serializers.Serializer):
    prompt_id = serializers.UUIDField()
    brain = serializers.CharField()
    lead = serializers.CharField()
    status = serializers.CharField(help_text=" | ".join(Prompt.Status.values))
    step = serializers.CharField(help_text=" → ".join(Prompt.Step.values))
    prompt = serializers.CharField()
    reason = serializers.CharField(allow_blank=True)
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()


class PromptOutput(PromptSummaryOutput):
    """A prompt whole: its summary, then what it was routed as and what came of it."""

    saga = serializers.UUIDField()
    expanded = serializers.CharField(
        allow_blank=True, help_text="The prompt as routed: references expanded, hook context added."
    )
    team = serializers.ListField(child=serializers.CharField())
    plan = serializers.JSONField(
        allow_null=True,
        help_text="{primary_role, workers, requires_review, reason, source, images?}: `images`, for a prompt "
        "with images, its URLs then `artifact:<name>` for each image artifact it references",
    )
    results = serializers.JSONField(
        help_text="Each support worker's WorkerResult, with its role and goal. Its `artifacts` are context "
        "references `{kind, uri, label}`; one of kind `artifact` is a saga artifact the worker named, its `uri` "
        "the artifact's download, with `name`, `content_type`, `size` and `sha256`."
    )
    mcp = serializers.JSONField(
        help_text='The primary\'s MCP servers: {server: {"status": "connected", "tools": [...]} '
        'or {"status": "failed", "reason": ..., "tools": []}}.'
    )
    answer = serializers.CharField(allow_blank=True, help_text="The primary's answer.")
    review = serializers.JSONField(allow_null=True)
    final_answer = serializers.CharField(allow_blank=True)


class PromptListOutput(serializers.Serializer):
    prompts = PromptSummaryOutput(many=True)


def principal(request: Request) -> User:
    if not isinstance(request.user, User):
        raise exceptions.NotAuthenticated()
    return request.user


def visible_saga(user: User, saga_id: UUID) -> Saga:
    """The saga, if `user` may see it; to anyone else `not_found`, as for one that does not exist."""
    saga = Saga.objects.visible_to(user).filter(pk=saga_id).first()
    if saga is None:
        raise errors.NotFound(f"No saga {saga_id}.")
    return saga


class PromptCreateApi(APIView):
    parser_classes = [LimitedJSONParser]

    @extend_schema(
        operation_id="prompts_create",
        parameters=[IDEMPOTENCY_KEY],
        request=PromptCreateInput,
        responses={202: PromptCreatedOutput, **problems(400, 401, 403, 404, 409, 413)},
    )
    def post(self, request: Request, saga_id: UUID) -> Response:
        """Run the Brain on a prompt (managers of the saga); `team` forces roles (no router, no review)."""
        user = principal(request)
        saga = visible_saga(user, saga_id)
        check_may_prompt(user, saga)
        serializer = PromptCreateInput(data=request.data)
        serializer.is_valid(raise_exception=True)
        data: dict[str, Any] = dict(serializer.validated_data)
        prompt, created = submit_prompt(
            saga=saga, by=user, text=data["prompt"], team=data["team"], brain=data["brain"], images=data["images"],
            idempotency_key=idempotency_key(request.headers),
        )  # fmt: skip
        # A replay gets the first answer, as a replayed request does; the prompt's own page has its status now.
        body = {"prompt_id": prompt.pk, "status": Prompt.Status.RUNNING, "lead": f"agent:{prompt.lead_name}"}
        headers = created_headers(reverse("api-prompt", args=[prompt.pk]), created)  # where to follow it
        return Response(PromptCreatedOutput(body).data, status=202, headers=headers)


class PromptListApi(APIView):
    @extend_schema(operation_id="prompts_list", responses={200: PromptListOutput, **problems(401, 404)})
    def get(self, request: Request, saga_id: UUID) -> Response:
        """The saga's prompts, newest first (the latest 200), for anyone who may see the saga; each
        one whole at `/api/v1/prompts/{prompt_id}/`."""
        saga = visible_saga(principal(request), saga_id)
        prompts = Prompt.objects.filter(saga=saga).select_related("brain")[:PROMPTS_LISTED]
        return Response(PromptListOutput({"prompts": [p.as_dict() for p in prompts]}).data)


class PromptCollectionApi(PromptListApi, PromptCreateApi):
    """`/sagas/{id}/prompts/`: two operations at one address."""


class PromptDetailApi(APIView):
    @extend_schema(operation_id="prompts_retrieve", responses={200: PromptOutput, **problems(401, 404)})
    def get(self, request: Request, prompt_id: UUID) -> Response:
        """The orchestration: status, plan, every WorkerResult, the primary's answer, the review."""
        visible = Saga.objects.visible_to(principal(request))
        prompt = Prompt.objects.select_related("brain").filter(pk=prompt_id, saga__in=visible).first()
        if prompt is None:
            raise errors.NotFound(f"No prompt {prompt_id}.")
        return Response(PromptOutput(prompt.as_dict()).data)


class PromptCancelApi(APIView):
    @extend_schema(
        operation_id="prompts_cancel", request=None, responses={200: PromptOutput, **problems(401, 403, 404, 409)}
    )
    def post(self, request: Request, prompt_id: UUID) -> Response:
        """Cancel a running prompt (managers of its saga): it fails with the reason "Cancelled by …",
        and the workers, primary or reviewer still at work are cancelled. A prompt that has ended
        is `invalid_state` (409), so a retry after a lost answer learns it is done."""
        prompt = cancel_prompt(prompt_id=prompt_id, by=principal(request))
        return Response(PromptOutput(prompt.as_dict()).data)
