"""`/sagas/{id}/remote-agents/`: the remote A2A agents a saga's agents may call with
`ask_remote_agent`. Whoever sees the saga lists them; managers allow (POST) and remove (DELETE)."""

from uuid import UUID

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from config import openapi
from config.openapi import Shape
from sagas import actions, errors
from sagas.access import may_manage
from sagas.actions.collaborators import NAME_PATTERN
from sagas.actions.remote import ENV_NAME_RE, URL_MAX
from sagas.api.views import ApiView, principal, problems, valid, visible_saga


class RemoteAgentInput(Shape):
    name = openapi.patterned(
        NAME_PATTERN, "Lowercase letters, digits, '.', '_' and '-'.", max_length=64,
        help_text="What agents call it by in ask_remote_agent.",
    )  # fmt: skip
    url = serializers.CharField(
        max_length=URL_MAX, help_text="Its A2A URL, http(s); loopback and private addresses only where allowed."
    )
    token_env = openapi.patterned(
        ENV_NAME_RE.pattern, "An environment variable's name.", max_length=100, required=False, default="",
        allow_blank=True, help_text="The workers' environment variable holding its bearer token (never the token).",
    )  # fmt: skip


class RemoteAgentOutput(serializers.Serializer):
    name = serializers.CharField()
    url = serializers.CharField()
    token_env = serializers.CharField()
    added_by = serializers.CharField()
    created_at = serializers.DateTimeField()


class RemoteAgentListOutput(serializers.Serializer):
    remote_agents = RemoteAgentOutput(many=True)


class RemoteAgentListApi(ApiView):
    @extend_schema(operation_id="remote_agents_list", responses={200: RemoteAgentListOutput, **problems(401, 404)})
    def get(self, request: Request, saga_id: UUID) -> Response:
        """The remote A2A agents this saga's agents may call."""
        saga = visible_saga(principal(request), saga_id)
        return Response(RemoteAgentListOutput({"remote_agents": actions.remote_agents_of(saga)}).data)


class RemoteAgentAllowApi(ApiView):
    callers = {"post": ("person",)}

    @extend_schema(
        operation_id="remote_agents_create",
        request=RemoteAgentInput,
        responses={201: RemoteAgentOutput, **problems(400, 401, 403, 404, 409)},
    )
    def post(self, request: Request, saga_id: UUID) -> Response:
        """A manager allows a remote A2A agent; a name or URL the saga already allows is 409 `name_taken`."""
        saga = visible_saga(principal(request), saga_id)
        if not may_manage(principal(request), saga):
            raise errors.Forbidden("Only managers of the saga allow remote agents.")
        data = valid(RemoteAgentInput, request.data)
        remote = actions.allow_remote_agent(
            saga=saga, name=data["name"], url=data["url"], token_env=data["token_env"], by=principal(request)
        )
        return Response(RemoteAgentOutput(remote).data, status=201)


class RemoteAgentCollectionApi(RemoteAgentListApi, RemoteAgentAllowApi):
    """`/sagas/{id}/remote-agents/`: two operations at one address."""


class RemoteAgentRemoveApi(ApiView):
    callers = {"delete": ("person",)}

    @extend_schema(operation_id="remote_agents_destroy", request=None, responses={204: None, **problems(401, 403, 404)})
    def delete(self, request: Request, saga_id: UUID, name: str) -> Response:
        """A manager removes a remote agent: no new call to it, and its open calls fail."""
        saga = visible_saga(principal(request), saga_id)
        actions.remove_remote_agent(saga=saga, name=name, by=principal(request))
        return Response(status=204)
