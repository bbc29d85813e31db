"""Agora as an MCP server: the collaboration tools of a saga, for any MCP-capable agent.

Built on the SDK's `MCPServer`; the protocol is the SDK's. A tool finds its caller through a
`Principal`: over stdio the API token the process was started with, over HTTP the bearer token of
each request (checked again at every call). Every kernel call runs in a thread (the ORM is
synchronous) and holds no database connection while a tool waits: `ask_agent(mode="wait")` and
`read_steering(wait_s=…)` wait on the same Redis doorbells as the REST API's long-polls, re-reading
the database on every ring and every `RECHECK_S` anyway, so a lost ring only delays an answer.
"""

import json
import logging
import time
from collections.abc import Callable
from typing import Annotated, Any, Literal, TypeVar

from asgiref.sync import sync_to_async
from mcp.server.mcpserver import Context, MCPServer
from mcp.types import CallToolResult, TextContent
from pydantic import Field

from config.payloads import Unstorable, check_storable
from gateways.mcp import operations as ops
from sagas import errors
from sagas.waits import Doorbell, release_connections
from sagas.wakeups import request_channel, steering_channel

logger = logging.getLogger(__name__)

RECHECK_S = 1.0
T = TypeVar("T")

# Where a tool finds the caller's API token: fixed for a stdio process, per request over HTTP.
Principal = Callable[[Context], str]

INSTRUCTIONS = (
    "You are an agent of an Agora saga. get_collaborators shows who you can see; ask_agent sends them "
    "requests (mode=wait returns the reply); requests for you and replies to yours arrive through "
    "read_steering (pass the returned cursor as `after` next time, which acknowledges what you read); "
    "answer a request with reply; ask_human sends a form to a person; call finish when you are done."
)


async def kernel(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    def call() -> T:
        try:
            return fn(*args, **kwargs)
        finally:
            release_connections()

    return await sync_to_async(call)()


def result(data: dict[str, Any]) -> CallToolResult:
    return CallToolResult(
        content=[TextContent(type="text", text=json.dumps(data, ensure_ascii=False))], structured_content=data
    )


def failure(exc: errors.KernelError) -> CallToolResult:
    """A kernel refusal as a tool error with the REST API's stable code (and details, such as field errors)."""
    data = {"error": {"code": exc.code, "message": exc.detail, **exc.extra}}
    return CallToolResult(
        content=[TextContent(type="text", text=json.dumps(data, ensure_ascii=False, default=str))],
        structured_content=data,
        is_error=True,
    )


async def wait_for_reply(key: str, request_id: str) -> dict[str, Any]:
    # Subscribe first, then read: a reply committed between the two still rings or is read. Each
    # re-check looks for the caller's token first: a revoked one ends the wait (AuthenticationFailed).
    async with Doorbell(request_channel(request_id)) as bell:
        while True:
            await kernel(ops.principal, key)
            outcome = await kernel(ops.wait_check, request_id)
            if isinstance(outcome, dict):
                return outcome
            await bell.ring_or_timeout(max(0.01, min(RECHECK_S, outcome)))


async def steering_after(key: str, after: int, wait_s: float) -> dict[str, Any]:
    until = time.monotonic() + min(max(wait_s, 0.0), ops.max_wait_s())
    user = await kernel(ops.principal, key)
    collaborator_id, page = await kernel(ops.read_steering, user, after=after)
    if page["items"] or time.monotonic() >= until:
        return page
    slot = await kernel(ops.hold_wait, user)
    try:
        async with Doorbell(steering_channel(collaborator_id)) as bell:
            while True:
                user = await kernel(ops.principal, key)  # a token revoked meanwhile ends the wait
                _, page = await kernel(ops.read_steering, user, after=after)
                left = until - time.monotonic()
                if page["items"] or left <= 0:
                    return page
                await bell.ring_or_timeout(max(0.01, min(RECHECK_S, left)))
    finally:
        await sync_to_async(slot.release)()


Json = Annotated[Any, Field(description="Any JSON value.")]


def storable(arguments: dict[str, Any]) -> None:
    """The checks every other entry applies to what it stores (config.payloads): NUL, lone
    surrogates, NaN, nesting past AGORA_MAX_JSON_DEPTH are `invalid_payload`, on every database."""
    try:
        check_storable(arguments, where="arguments")
    except Unstorable as exc:
        raise errors.InvalidPayload(str(exc)) from None


def build_server(principal: Principal) -> MCPServer:
    """The MCP server of Agora's collaboration tools, finding each call's caller with `principal`."""
    server: MCPServer = MCPServer("agora", instructions=INSTRUCTIONS)

    async def as_caller(ctx: Context, fn: Callable[..., dict[str, Any]], **kwargs: Any) -> CallToolResult:
        try:
            storable(kwargs)
            user = await kernel(ops.principal, principal(ctx))
            return result(await kernel(fn, user, **kwargs))
        except errors.KernelError as exc:
            return failure(exc)

    @server.tool()
    async def get_collaborators(ctx: Context) -> CallToolResult:
        """List the people and agents of your saga that you can see."""
        return await as_caller(ctx, ops.get_collaborators)

    @server.tool()
    async def ask_agent(
        ctx: Context,
        to: Annotated[str, Field(description="Collaborator id such as agent:coder-01.")],
        type: Annotated[str, Field(description="A short dotted request type such as code.review.")],
        payload: Json,
        mode: Literal["async", "wait"] = "async",
        timeout_s: Annotated[
            float | None, Field(description="How long a wait may last, in seconds.", allow_inf_nan=False)
        ] = None,
        idempotency_key: Annotated[
            str, Field(description="Retries with the same key and body return the first request.", max_length=200)
        ] = "",
    ) -> CallToolResult:
        """Send a request to another agent of the saga. mode=async returns a request_id at once and the reply
        arrives through read_steering; mode=wait returns the reply (or `timed_out`, the reply coming later)."""
        slot = None
        try:
            storable({"to": to, "type": type, "payload": payload, "idempotency_key": idempotency_key})
            user = await kernel(ops.principal, principal(ctx))
            if mode == "wait":
                slot = await kernel(ops.hold_wait, user)
            request, _ = await kernel(
                ops.ask_agent, user, to=to, type=type, payload=payload, mode=mode, timeout_s=timeout_s,
                idempotency_key=idempotency_key,
            )  # fmt: skip
            if request.mode != "wait":
                return result(ops.pending(request.pk))
            return result(await wait_for_reply(principal(ctx), request.pk))
        except errors.KernelError as exc:
            return failure(exc)
        finally:
            if slot is not None:
                await sync_to_async(slot.release)()

    @server.tool()
    async def reply(
        ctx: Context,
        request_id: str,
        payload: Json = None,
        error: Annotated[
            Any, Field(description='Instead of a payload: {"code", "message"}; fails the request.')
        ] = None,
    ) -> CallToolResult:
        """Answer a request addressed to you, with a payload or an error."""
        return await as_caller(ctx, ops.reply, request_id=request_id, payload=payload, error=error)

    @server.tool()
    async def read_steering(
        ctx: Context,
        after: Annotated[
            int, Field(description="The cursor from your last read; items up to it are acknowledged.")
        ] = 0,
        wait_s: Annotated[
            float, Field(description="Wait up to this many seconds for a new item.", allow_inf_nan=False)
        ] = 0,
    ) -> CallToolResult:
        """Your inbox: requests for you, replies to your requests, notices and people's messages, after a cursor."""
        try:
            return result(await steering_after(principal(ctx), after, wait_s))
        except errors.KernelError as exc:
            return failure(exc)

    @server.tool()
    async def cancel_request(ctx: Context, request_id: str) -> CallToolResult:
        """Withdraw a request you sent; its recipient gets a notice."""
        return await as_caller(ctx, ops.cancel_request, request_id=request_id)

    @server.tool()
    async def ask_human(
        ctx: Context,
        title: str,
        fields: Annotated[
            list[dict[str, Any]],
            Field(
                description="Form fields: name, label, type (text, textarea, integer, number, boolean, choice, "
                "multichoice, date, email), required, choices."
            ),
        ],
        to: Annotated[str | None, Field(description="human:<name>; the saga's owner when omitted.")] = None,
        idempotency_key: Annotated[str, Field(max_length=200)] = "",
    ) -> CallToolResult:
        """Ask a person of the saga to fill in a form; the answer arrives through read_steering."""
        return await as_caller(ctx, ops.ask_human, title=title, fields=fields, to=to, idempotency_key=idempotency_key)

    @server.tool()
    async def finish(ctx: Context) -> CallToolResult:
        """End your work in the saga; requests still waiting on you fail with recipient_unavailable."""
        return await as_caller(ctx, ops.finish)

    return server
