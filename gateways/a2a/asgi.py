"""The A2A gateway's ASGI app, mounted beside Django's under /a2a/ (config/asgi.py).

Per exposed agent: its card at `/a2a/<saga>/<agent>/.well-known/agent-card.json` and its JSON-RPC
endpoint at `/a2a/<saga>/<agent>/`, served by the SDK's dispatcher (A2A 1.0, and the 0.3 method
names beside it). Every call is authorized here, before the dispatcher: an agent that is absent or
not exposed, and a token of someone outside the saga, all get the same 404.
"""

from typing import Any

from a2a.server.context import ServerCallContext
from a2a.server.request_handlers.response_helpers import build_error_response
from a2a.server.routes.common import DefaultServerCallContextBuilder
from a2a.server.routes.jsonrpc_dispatcher import JsonRpcDispatcher
from a2a.types import a2a_pb2 as pb
from a2a.utils.constants import AGENT_CARD_WELL_KNOWN_PATH, PROTOCOL_VERSION_1_0
from a2a.utils.errors import InvalidParamsError
from asgiref.sync import sync_to_async
from django.conf import settings
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from accounts.authentication import authenticate_key
from config.edge import headers_of, host_allowed, within_limit
from config.payloads import MalformedJson, Unstorable, loads
from config.problems import SERVER_ERROR_DETAIL
from gateways.a2a.cards import card_dict, exposed_agent, host_agent
from gateways.a2a.handler import CALLER, Caller, KernelRequestHandler
from sagas.models import Collaborator
from sagas.waits import release_connections

PROBLEM = "application/problem+json"
WELL_KNOWN = AGENT_CARD_WELL_KNOWN_PATH


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
        return Caller(sender=sender, agent=agent, token_id=token.pk)
    finally:
        release_connections()


def load_card(saga_id: str | None, name: str, base_url: str) -> dict[str, Any] | None:
    try:
        agent = host_agent() if saga_id is None else exposed_agent(saga_id, name)
        return None if agent is None else card_dict(agent, base_url=base_url)
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
    base = settings.AGORA_PUBLIC_URL or f"{request.url.scheme}://{request.url.netloc}"
    saga_id = request.path_params.get("saga")
    body = await sync_to_async(load_card)(
        None if saga_id is None else str(saga_id), request.path_params.get("agent", ""), base
    )
    return not_found() if body is None else JSONResponse(body)


def method_of(rpc: Any) -> str | None:
    """The call's method, when the body is a call with a method name at all (the dispatcher answers
    the rest with the protocol's errors)."""
    method = rpc.get("method") if isinstance(rpc, dict) else None
    return method if isinstance(method, str) else None


def assume_current_version(request: Request, rpc: Any) -> None:
    """A call without an A2A-Version header is a 0.3 call, says the spec; but a client that uses the
    1.0 method names (SendMessage, GetTask…) while omitting the header plainly speaks 1.0."""
    if "a2a-version" in request.headers:
        return
    if method_of(rpc) in JsonRpcDispatcher.METHOD_TO_MODEL:
        request.scope["headers"] = [*request.scope["headers"], (b"a2a-version", PROTOCOL_VERSION_1_0.encode())]
        vars(request).pop("_headers", None)  # Starlette caches the parsed headers


async def rpc(request: Request) -> Response:
    saga_id, name = request.path_params["saga"], request.path_params["agent"]
    caller = await sync_to_async(authorize)(str(saga_id), name, bearer(request))
    if isinstance(caller, Response):
        return caller
    request.state.caller = caller
    # Read as every other entry reads JSON (config.payloads): not JSON (bad UTF-8, NaN, nesting past
    # the decoder) is the protocol's parse error, text no database stores or nesting past
    # AGORA_MAX_JSON_DEPTH its invalid params; neither reaches the dispatcher.
    try:
        rpc_body = loads(await request.body(), where="The request")
    except MalformedJson as exc:
        return rpc_error(-32700, str(exc))  # JSON-RPC's parse error
    except Unstorable as exc:
        return rpc_error(-32602, str(exc))  # invalid params
    assume_current_version(request, rpc_body)
    if (refused := check_enums(rpc_body)) is not None:
        return JSONResponse(build_error_response(call_id(rpc_body), refused))
    response = await dispatcher.handle_requests(request)
    if is_streaming(rpc_body) and isinstance(response, JSONResponse) and response.status_code == 200:
        return as_event_stream(response)
    return response


def call_id(body: Any) -> str | int | None:
    """The id of a call, as JSON-RPC allows one (a string or an integer); None for any other."""
    found = body.get("id") if isinstance(body, dict) else None
    return found if isinstance(found, str | int) and not isinstance(found, bool) else None


def rpc_error(code: int, message: str) -> JSONResponse:
    """A JSON-RPC error for a body the dispatcher never sees (so no call id is known)."""
    return JSONResponse({"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}})


STREAMING_METHODS = frozenset({"SendStreamingMessage", "SubscribeToTask", "message/stream", "tasks/resubscribe"})


def is_streaming(rpc: Any) -> bool:
    return method_of(rpc) in STREAMING_METHODS


def as_event_stream(response: JSONResponse) -> Response:
    """A streaming method's error (an unknown task, a finished one, the wait cap…) as the one event of
    its stream: the spec answers those methods with `text/event-stream`, while the SDK's dispatcher
    answers an error raised before the first event with a JSON body. Clients read either; some
    (the TCK's) only the stream."""
    return Response(b"data: " + bytes(response.body) + b"\n\n", media_type="text/event-stream")


def check_enums(rpc: Any) -> InvalidParamsError | None:
    """The dispatcher parses params ignoring unknown fields, which also turns an unknown enum
    value into "unspecified"; a ListTasks status filter that names no state must be refused."""
    if method_of(rpc) not in ("ListTasks", "tasks/list"):
        return None
    params = rpc.get("params")
    status = params.get("status") if isinstance(params, dict) else None
    states = pb.TaskState.DESCRIPTOR
    if status is None or (isinstance(status, str | int) and (status in states.values_by_name
                                                              or status in states.values_by_number)):  # fmt: skip
        return None
    return InvalidParamsError(message=f"Unknown task state {status!r}.")


async def fallback(request: Request) -> Response:
    return not_found()


async def crashed(request: Request, exc: Exception) -> Response:
    """What a crash answers (logged with its traceback by the server), as the gateway's clients read
    the rest: a JSON-RPC internal error for a call, a problem for a card; no details."""
    if request.method == "POST":
        return JSONResponse(
            {"jsonrpc": "2.0", "id": None, "error": {"code": -32603, "message": "Internal error; it has been logged."}},
            status_code=500,
        )
    return problem(500, "server_error", "Server error", SERVER_ERROR_DETAIL)


app = Starlette(
    routes=[
        Route(WELL_KNOWN, card, methods=["GET"]),
        Route("/a2a/{saga:uuid}/{agent:str}" + WELL_KNOWN, card, methods=["GET"]),
        Route("/a2a/{saga:uuid}/{agent:str}/", rpc, methods=["POST"]),
        Route("/a2a/{saga:uuid}/{agent:str}", rpc, methods=["POST"]),
        Route("/a2a/{rest:path}", fallback, methods=["GET", "POST", "PUT", "DELETE", "PATCH"]),
    ],
    exception_handlers={500: crashed},  # Starlette's own answer is a text page
)


def with_gateway(django_app: Any) -> Any:
    """Django's HTTP app, with /a2a/ served by the gateway."""

    async def http(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if not (scope["path"].startswith("/a2a/") or scope["path"] == WELL_KNOWN):
            await django_app(scope, receive, send)
        elif (refused := refusal(scope)) is not None:
            await refused(scope, receive, send)
        else:
            await within_limit(app, scope, receive, send)

    return http


def refusal(scope: dict[str, Any]) -> JSONResponse | None:
    """What Django refuses before any view, refused here too: a Host not in ALLOWED_HOSTS (a card
    names the host it was asked on), and a path with a NUL (no database stores one)."""
    if not host_allowed(headers_of(scope)):
        return problem(400, "invalid_host", "Bad request", "Host not allowed.")
    if "\x00" in scope["path"]:
        return problem(400, "invalid_payload", "Invalid payload", "The path contains a NUL character.")
    return None
