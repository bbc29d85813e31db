"""HTTP helpers for the API tests: DRF's APIClient signed in as one of the cast, the check of a
problem response, and a small HTTP client for the tests that run against a real daphne process (the
`web_server` fixture), on the standard library only so that every call goes over a real socket."""

import http.client
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from rest_framework.test import APIClient

from accounts.actions import issue_token
from accounts.models import User
from tests.support import wait_until


def client_for(user: User, scheme: str = "Token") -> APIClient:
    """An in-process client authenticated with a fresh token of `user` (agents use "Bearer")."""
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"{scheme} {issue_token(user=user)}")
    return api


def problem(response: Any, status: int, code: str) -> dict[str, Any]:
    """The body of an APIClient response, after checking it is a problem of this status and code."""
    assert response.status_code == status, (response.status_code, response.content)
    assert response["Content-Type"].startswith("application/problem+json")
    body: dict[str, Any] = json.loads(response.content)
    assert body["code"] == code, body
    return body


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: Any

    def ok(self, status: int) -> Any:
        """The body, after checking the status (the failure shows what came back instead)."""
        assert self.status == status, f"expected {status}, got {self.status}: {self.body}"
        return self.body

    def problem(self, status: int, code: str) -> dict[str, Any]:
        assert self.status == status, f"expected {status} {code}, got {self.status}: {self.body}"
        assert self.headers["content-type"].startswith("application/problem+json"), self.headers
        assert self.body["code"] == code, self.body
        body: dict[str, Any] = self.body
        return body


@dataclass
class Http:
    """One principal's client: `Http(server.url, token)`; every call is a new connection."""

    base_url: str
    token: str | None = None
    scheme: str = "Bearer"
    timeout: float = 60.0
    host: str = field(init=False)
    port: int = field(init=False)

    def __post_init__(self) -> None:
        parts = urlsplit(self.base_url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        raw: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> Reply:
        sent = dict(headers or {})
        if self.token:
            sent.setdefault("Authorization", f"{self.scheme} {self.token}")
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        if data is not None:
            sent.setdefault("Content-Type", "application/json")
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            conn.request(method, path, body=data, headers=sent)
            response = conn.getresponse()
            content = response.read()
            received = {name.lower(): value for name, value in response.getheaders()}
        finally:
            conn.close()
        parsed: Any = content.decode(errors="replace")
        if received.get("content-type", "").split(";")[0].endswith("json") and content:
            parsed = json.loads(content)
        return Reply(response.status, received, parsed)

    def get(self, path: str, **kwargs: Any) -> Reply:
        return self.call("GET", path, **kwargs)

    def post(self, path: str, body: Any = None, **kwargs: Any) -> Reply:
        return self.call("POST", path, body, **kwargs)

    def steering_item(
        self, after: int, match: Callable[[dict[str, Any]], bool], *, timeout: float = 20
    ) -> dict[str, Any]:
        """Long-poll this agent's steering (without acknowledging) until an item matches."""

        def look() -> dict[str, Any] | None:
            items = self.get(f"/api/v1/steering/?after={after}&wait=2").ok(200)["items"]
            return next((item for item in items if match(item)), None)

        found = wait_until(look, timeout=timeout, interval=0, what="a steering item")
        assert found is not None
        return found
