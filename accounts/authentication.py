from typing import Any

from rest_framework import authentication, exceptions
from rest_framework.request import Request

from accounts.models import ApiToken, User


class TokenAuthentication(authentication.BaseAuthentication):
    """`Authorization: Token <key>` or `Bearer <key>`, for people and agents alike."""

    keywords = ("token", "bearer")

    def authenticate(self, request: Request) -> tuple[User, ApiToken] | None:
        parts = authentication.get_authorization_header(request).split()
        if not parts or parts[0].decode(errors="replace").lower() not in self.keywords:
            return None
        if len(parts) != 2:
            raise exceptions.AuthenticationFailed("Malformed Authorization header.")
        token = authenticate_key(parts[1].decode(errors="replace"))
        if token is None:
            raise exceptions.AuthenticationFailed("Invalid token.")
        return token.user, token

    def authenticate_header(self, request: Request) -> str:
        """The 401's challenge, in the scheme the client used (agents send Bearer); Token by default."""
        parts = authentication.get_authorization_header(request).split()
        return 'Bearer realm="agora"' if parts and parts[0].lower() == b"bearer" else "Token"


def authenticate_key(key: str) -> ApiToken | None:
    return ApiToken.objects.matching(key).select_related("user").first()


def token_from_scope(scope: dict[str, Any]) -> str | None:
    """The key an ASGI client sent in its Authorization header, if any (WebSocket clients)."""
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            parts = value.decode(errors="replace").split()
            if len(parts) == 2 and parts[0].lower() in TokenAuthentication.keywords:
                return parts[1]
    return None
