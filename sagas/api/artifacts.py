"""Artifacts over REST: list, add (JSON text or a multipart file) and download, for whoever may see
the saga; 404 `not_found` for anyone else, as for a saga that does not exist."""

from typing import Any
from uuid import UUID

from django.urls import reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.parsers import MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response

from config.openapi import Shape
from config.parsers import LimitedJSONParser
from sagas import actions, errors
from sagas.api.views import ApiView, principal, problems, valid, visible_saga
from sagas.artifacts import download_response, upload_too_large
from sagas.models import Artifact


class ArtifactOutput(serializers.Serializer):
    name = serializers.CharField()
    content_type = serializers.CharField()
    size = serializers.IntegerField()
    sha256 = serializers.CharField()
    added_by = serializers.CharField()
    created_at = serializers.DateTimeField()


class ArtifactListOutput(serializers.Serializer):
    artifacts = ArtifactOutput(many=True)


class ArtifactTextInput(Shape):
    name = serializers.CharField(max_length=100)
    text = serializers.CharField(trim_whitespace=False)
    content_type = serializers.CharField(max_length=120, default="text/plain")


class ArtifactFileInput(Shape):
    name = serializers.CharField(max_length=100, required=False, help_text="Default: the file's name.")
    file = serializers.FileField()


class ArtifactListApi(ApiView):
    @extend_schema(operation_id="artifacts_list", responses={200: ArtifactListOutput, **problems(401, 404)})
    def get(self, request: Request, saga_id: UUID) -> Response:
        saga = visible_saga(principal(request), saga_id)
        return Response(ArtifactListOutput({"artifacts": Artifact.objects.listing(saga)}).data)


class ArtifactAddApi(ApiView):
    parser_classes = [LimitedJSONParser, MultiPartParser]

    @extend_schema(
        operation_id="artifacts_create",
        request={"application/json": ArtifactTextInput, "multipart/form-data": ArtifactFileInput},
        responses={201: ArtifactOutput, **problems(400, 401, 404, 409, 413)},
    )
    def post(self, request: Request, saga_id: UUID) -> Response:
        """Add a text (JSON: `name`, `text`, `content_type`) or a file (multipart: `file`, `name`);
        at most AGORA_MAX_ARTIFACT_BYTES; a name is used once per saga (409 `name_taken`)."""
        saga = visible_saga(principal(request), saga_id)
        if upload_too_large(request):
            raise errors.PayloadTooLarge("This upload is over the artifact size limit.")
        if request.content_type.startswith("multipart/"):
            upload: Any = valid(ArtifactFileInput, request.data)
            name = upload.get("name") or upload["file"].name
            content, content_type = upload["file"].read(), upload["file"].content_type
        else:
            text = valid(ArtifactTextInput, request.data)
            name, content, content_type = text["name"], text["text"].encode(), text["content_type"]
        artifact = actions.add_artifact(
            saga=saga, name=name, content=content, content_type=content_type, by=principal(request)
        )
        location = reverse("api-artifact", args=[artifact.saga_id, artifact.name])
        return Response(ArtifactOutput(artifact).data, status=201, headers={"Location": location})


class ArtifactCollectionApi(ArtifactListApi, ArtifactAddApi):
    """`/sagas/{id}/artifacts/`: two operations at one address."""


class AnyAccept(BaseContentNegotiation):
    """A download is the artifact's own bytes whatever the client accepts; errors stay JSON."""

    def select_parser(self, request: Request, parsers: Any) -> Any:
        return parsers[0] if parsers else None

    def select_renderer(self, request: Request, renderers: Any, format_suffix: str | None = None) -> Any:
        return renderers[0], renderers[0].media_type


class ArtifactDownloadApi(ApiView):
    content_negotiation_class = AnyAccept

    @extend_schema(
        operation_id="artifacts_download",
        responses={(200, "*/*"): OpenApiResponse(OpenApiTypes.BINARY, description="The artifact, as a download."),
                   **problems(401, 404)},
    )  # fmt: skip
    def get(self, request: Request, saga_id: UUID, name: str) -> Any:
        saga = visible_saga(principal(request), saga_id)
        artifact = Artifact.objects.filter(saga=saga, name=name).first()
        if artifact is None:
            raise errors.NotFound(f"No artifact {name} in this saga.")
        return download_response(artifact)
