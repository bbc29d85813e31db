from typing import Any

from django.contrib.auth import authenticate
from django.utils.cache import add_never_cache_headers
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import permissions, serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.actions import issue_token
from accounts.throttles import SignInThrottle
from config.openapi import ProblemOutput
from config.parsers import LimitedJSONParser
from config.problems import problem


class TokenCreateInput(serializers.Serializer):
    username = serializers.CharField(max_length=150)
    password = serializers.CharField(max_length=4096, trim_whitespace=False)


class TokenOutput(serializers.Serializer):
    token = serializers.CharField(help_text="Send it as `Authorization: Token <token>`; it is shown this once.")


class TokenCreateApi(APIView):
    """`POST /api/v1/auth/token/`: a person's username and password for a new API token."""

    authentication_classes: list[Any] = []  # credentials are the body; no session, so no CSRF either
    permission_classes = [permissions.AllowAny]
    throttle_classes = [SignInThrottle]  # per client address and per account, shared by every process
    parser_classes = [LimitedJSONParser]

    @extend_schema(
        operation_id="auth_token_create",
        request=TokenCreateInput,
        responses={
            200: TokenOutput,
            (400, "application/problem+json"): OpenApiResponse(
                ProblemOutput, description="invalid_credentials or invalid_payload"
            ),
            (429, "application/problem+json"): OpenApiResponse(
                ProblemOutput, description="throttled: too many attempts; see Retry-After"
            ),
        },
        auth=[],
    )
    def post(self, request: Request) -> Response:
        serializer = TokenCreateInput(data=request.data)
        serializer.is_valid(raise_exception=True)
        user = authenticate(
            request._request,
            username=serializer.validated_data["username"],
            password=serializer.validated_data["password"],
        )
        # Agents never log in (their service users have no usable password; this holds even if one had).
        if user is None or getattr(user, "is_agent", True):
            return problem(400, "invalid_credentials", "Invalid credentials", "Unknown username or wrong password.")
        response = Response(TokenOutput({"token": issue_token(user=user)}).data)
        add_never_cache_headers(response)  # a token must stay out of every cache (no-store)
        return response


class TokenScheme(OpenApiAuthenticationExtension):
    """How the OpenAPI document describes `accounts.authentication.TokenAuthentication`: as two
    schemes, one for people and one for agents, so that a client (and a generated one) knows which
    credential an operation is for. A view says who calls each of its methods with a `callers`
    mapping (method → "person" and/or "agent"); without one, both."""

    target_class = "accounts.authentication.TokenAuthentication"
    name = ["personToken", "agentToken"]

    def get_security_requirement(self, auto_schema: Any) -> list[dict[str, list[Any]]]:
        callers = getattr(auto_schema.view, "callers", {}).get(auto_schema.method.lower(), ("person", "agent"))
        return [{f"{caller}Token": []} for caller in callers]

    def get_security_definition(self, auto_schema: Any) -> list[dict[str, str]]:
        return [
            {
                "type": "apiKey",
                "in": "header",
                "name": "Authorization",
                "description": "People: `Token <key>`, the key from POST /api/v1/auth/token/.",
            },
            {
                "type": "http",
                "scheme": "bearer",
                "description": "Agents: `Bearer <key>`, the token returned once when the agent was added.",
            },
        ]
