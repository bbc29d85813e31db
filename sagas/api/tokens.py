"""`/sagas/{id}/collaborators/{cid}/token/`: rotate (POST) or revoke (DELETE) an agent's API token."""

from uuid import UUID

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from sagas import actions
from sagas.api.views import ApiView, principal, problems, visible_saga


class TokenRotatedOutput(serializers.Serializer):
    id = serializers.CharField(help_text="The agent, such as agent:coder-01.")
    token = serializers.CharField(help_text="Its new API token, shown this once; the old ones no longer work.")


class CollaboratorTokenApi(ApiView):
    """Managers of the saga may change any of its agents' tokens; an agent, its own."""

    @extend_schema(
        operation_id="collaborators_token_rotate",
        request=None,
        responses={200: TokenRotatedOutput, **problems(401, 403, 404, 409)},
    )
    def post(self, request: Request, saga_id: UUID, cid: str) -> Response:
        """Rotate: the agent's tokens are revoked and a new one is returned, this once."""
        saga = visible_saga(principal(request), saga_id)
        agent, key = actions.rotate_agent_token(saga=saga, handle=cid, by=principal(request))
        response = Response(TokenRotatedOutput({"id": agent.handle, "token": key}).data)
        response["Cache-Control"] = "no-store"  # a token must not stay in any cache
        return response

    @extend_schema(
        operation_id="collaborators_token_revoke", request=None, responses={204: None, **problems(401, 403, 404)}
    )
    def delete(self, request: Request, saga_id: UUID, cid: str) -> Response:
        """Revoke: every call with the agent's tokens fails from now on, open sockets and waits included."""
        saga = visible_saga(principal(request), saga_id)
        actions.revoke_agent_token(saga=saga, handle=cid, by=principal(request))
        return Response(status=204)
