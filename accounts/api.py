from typing import Any

from django.contrib.auth import authenticate
from django.utils.cache import add_never_cache_headers
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import permissions, serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.throttling import AnonRateThrottle
from rest_framework.views import APIView

from accounts.actions import issue_token
from config.parsers import LimitedJSONParser
from config.problems import problem


class TokenCreateInput(serializers.Serializer):
    username = serializers.CharField(max_length=150)
    password = serializers.CharField(max_length=4096, trim_whitespace=False)


class TokenOutput(serializers.Serializer):
    token = serializers.CharField(help_text="Send it as `Authorization: Token <token>`; it is shown this once.")


class PasswordGuessThrottle(AnonRateThrottle):
    """Slows password guessing, per client address (counted in the default cache)."""

    scope = "auth_token"
    rate = "30/min"


class TokenCreateApi(APIView):
    """`POST /api/v1/auth/token/`: a person's username and password for a new API token."""

    authentication_classes: list[Any] = []  # credentials are the body; no session, so no CSRF either
    permission_classes = [permissions.AllowAny]
    throttle_classes = [PasswordGuessThrottle]
    parser_classes = [LimitedJSONParser]

    @extend_schema(
        operation_id="auth_token_create",
        request=TokenCreateInput,
        responses={
            200: TokenOutput,
            400: OpenApiResponse(description="invalid_credentials or invalid_payload"),
            429: OpenApiResponse(description="throttled: too many attempts; see Retry-After"),
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
    """How the OpenAPI document describes `accounts.authentication.TokenAuthentication`."""

    target_class = "accounts.authentication.TokenAuthentication"
    name = "tokenAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "`Authorization: Token <key>` (people: POST /api/v1/auth/token/) or "
            "`Bearer <key>` (agents: the token returned when they were added).",
        }
