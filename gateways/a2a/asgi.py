"""The A2A gateway's ASGI app, mounted beside Django's under /a2a/ (config/asgi.py).

Per exposed agent: its card at `/a2a/<saga>/<agent>/.well-known/agent-card.json` and its JSON-RPC
endpoint at `/a2a/<saga>/<agent>/`, served by the SDK's dispatcher (A2A 1.0, and the 0.3 method
names beside it). Every call is authorized here, before the dispatcher: an agent that is absent or
not exposed, and a token of someone outside the saga, all get the same 404.
"""

from typing import Any

from a2a.server.context import ServerCallContext
from a2a.server.request_handlers.response_helpers import agent_card_to_dict
from a2a.server.routes.common import DefaultServerCallContextBuilder
from a2a.server.routes.jsonrpc_dispatcher import JsonRpcDispatcher
from asgiref.sync import sync_to_async
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from accounts.authentication import authenticate_key
from gateways.a2a.cards import card_of, exposed_agent
from gateways.a2a.handler import CALLER, Caller, KernelRequestHandler
from gateways.a2a.waiting import release_connections
from sagas.models import Collaborator

PROBLEM = "application/problem+json"


def problem(status: int, code: str, title: str, detail: str, **headers: str) -> JSONResponse:
    body = {"type": "about:blank", "title": title, "status": status, "code": code, "detail": detail}
    return JSONResponse(body, status_code=status, media_type=PROBLEM, headers=headers)


def not_found() -> JSONResponse:
    return problem(404, "not_found", "Not found", "No such agent.")


def unauthenticated(detail: str) -> JSONResponse:
    return problem(401, "not_authenticated", "Unauthorized", detail, **{"WWW-Authenticate": 'Bearer realm="agora"'})


def bearer(request: Request) -> str | None:
    parts = request.headers.get("authorization", "").split()
    if len(parts) == 2 and parts[0].lower() in ("bearer", "token"):
        return parts[1]
    return None


def authorize(saga_id: str, name: str, key: str | None) -> Caller | JSONResponse:
    try:
        agent = exposed_agent(saga_id, name)
        if agent is None:
            return not_found()
        if key is None:
            return unauthenticated("Send an Agora API token: Authorization: Bearer <token>.")
        token = authenticate_key(key)
        if token is None or not token.user.is_active:
            return unauthenticated("Invalid token.")
        sender = Collaborator.objects.filter(saga_id=agent.saga_id, user=token.user).select_related("user").first()
        if sender is None:  # an outsider learns nothing, not even that the agent exists
            return not_found()
        return Caller(sender=sender, agent=agent)
    finally:
        release_connections()


def load_card(saga_id: str, name: str, base_url: str) -> dict[str, Any] | None:
    try:
        agent = exposed_agent(saga_id, name)
        return None if agent is None else agent_card_to_dict(card_of(agent, base_url=base_url))
    finally:
        release_connections()


class ContextBuilder(DefaultServerCallContextBuilder):
    def build(self, request: Request) -> ServerCallContext:
        context = super().build(request)
        context.state[CALLER] = request.state.caller
        return context


dispatcher = JsonRpcDispatcher(
    request_handler=KernelRequestHandler(), context_builder=ContextBuilder(), enable_v0_3_compat=True
)


async def card(request: Request) -> Response:
    base = f"{request.url.scheme}://{request.url.netloc}"
    body = await sync_to_async(load_card)(request.path_params["saga"], request.path_params["agent"], base)
    return not_found() if body is None else JSONResponse(body)


async def rpc(request: Request) -> Response:
    saga_id, name = request.path_params["saga"], request.path_params["agent"]
    caller = await sync_to_async(authorize)(str(saga_id), name, bearer(request))
    if isinstance(caller, Response):
        return caller
    request.state.caller = caller
    return await dispatcher.handle_requests(request)


async def fallback(request: Request) -> Response:
    return not_found()


app = Starlette(
    routes=[
        Route("/a2a/{saga:uuid}/{agent:str}/.well-known/agent-card.json", card, methods=["GET"]),
        Route("/a2a/{saga:uuid}/{agent:str}/", rpc, methods=["POST"]),
        Route("/a2a/{saga:uuid}/{agent:str}", rpc, methods=["POST"]),
        Route("/a2a/{rest:path}", fallback, methods=["GET", "POST", "PUT", "DELETE", "PATCH"]),
    ]
)


def with_gateway(django_app: Any) -> Any:
    """Django's HTTP app, with /a2a/ served by the gateway."""

    async def http(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["path"].startswith("/a2a/"):
            await app(scope, receive, send)
        else:
            await django_app(scope, receive, send)

    return http
