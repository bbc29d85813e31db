"""Outbound A2A: an agent's `ask_remote_agent` call, carried out with the a2a-sdk client.

The kernel holds the call (`sagas.remotes.RemoteCall`) and rings this follower by name after
commit. Each step is one short Celery task: claim the step (compare-and-set), make one exchange
with the remote agent outside any transaction (send the message without blocking, or read the
remote task), then either end the call once (`settle_remote_call`: completed with the task's
artifacts, or failed with a clear code) or schedule the next step. A remote task still at work is
looked at again soon and then less often; a transport failure is tried again with backoff; the
call's deadline bounds both. No step holds a worker while the remote agent thinks, so a remote
agent served by the same workers is never starved by its caller. A step cut short by a crash is
claimed again by the reconciler once its lease lapses (renewed while its exchange runs: leased());
the message carries the call's id as its `messageId`, so a resend after a crash is the same message
to a remote agent that deduplicates.
"""

import asyncio
import logging
import os
from collections.abc import Coroutine
from typing import Any

import httpx
from a2a.client import A2AClientError, A2AClientTimeoutError, AgentCardResolutionError, ClientConfig, create_client
from a2a.types import a2a_pb2 as pb
from a2a.utils.errors import A2AError
from a2a.utils.push_url_validator import validate_push_notification_url
from django.conf import settings
from django.db import DatabaseError, InterfaceError, connection
from django.utils import timezone
from google.protobuf.json_format import MessageToDict

from config.payloads import text_problem
from gateways.a2a.public_net import NotPublic, async_public_transport
from sagas import actions
from sagas.remotes import RemoteCall

logger = logging.getLogger(__name__)

HTTP_TIMEOUT_S = 10.0
POLL_S = (0.1, 0.2, 0.5, 1.0, 2.0)  # how soon to look again at a remote task at work, growing
BACKOFF_S = 0.5  # after a transport failure: 0.5, 1, 2, 4 … s, at most MAX_BACKOFF_S
MAX_BACKOFF_S = 30.0

FAILED_STATES = {
    pb.TASK_STATE_FAILED: "remote_failed",
    pb.TASK_STATE_CANCELED: "remote_cancelled",
    pb.TASK_STATE_REJECTED: "remote_rejected",
    # The remote agent asks back: a call is one message, so it ends here with what it asked.
    pb.TASK_STATE_INPUT_REQUIRED: "remote_input_required",
    pb.TASK_STATE_AUTH_REQUIRED: "remote_auth_required",
}


class Transient(Exception):
    """The remote agent could not be reached or answered 5xx/429: try again later."""


class Refused(Exception):
    """The remote agent (or our own rules) refused the call: it fails with this code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def follow(call_id: str, step: int) -> None:
    """One step of a call; safe to run twice (the claim lets one through)."""
    call = actions.claim_remote_step(call_id=call_id, step=step, lease_s=settings.AGORA_LEASE_S)
    if call is None:
        return  # a duplicated doorbell, a step another worker holds, or the call has ended
    remote = call.remote_agent
    if remote is None or remote.url != call.url:
        fail(call, "remote_not_allowed", f"{call.agent_name} is no longer allowed in this saga.")
        return
    if call.caller.run.is_finished:  # shut down, its prompt cancelled, its saga ended: no one waits
        if call.task_id:
            cancel_quietly(call, remote.token_env)
        fail(call, "caller_ended", f"{call.caller.handle} ended before {call.agent_name} answered.")
        return
    if timezone.now() >= call.deadline:
        if call.task_id:
            cancel_quietly(call, remote.token_env)
        fail(call, "timeout", f"{call.agent_name} did not finish within the call's timeout.")
        return
    attempts = call.attempts + 1
    try:
        task = asyncio.run(leased(call, exchange(call, remote.token_env)))
    except Transient as exc:
        failures = call.failures + 1
        logger.info("remote call %s to %s: %s (failure %s)", call.pk, call.url, exc, failures)
        delay = min(BACKOFF_S * 2 ** (failures - 1), MAX_BACKOFF_S, remaining_s(call) + 0.05)
        actions.schedule_remote_step(call=call, delay_s=delay, failures=failures, attempts=attempts)
        return
    except Refused as exc:
        actions.record_attempts(call_id=call.pk, attempts=attempts)
        fail(call, exc.code, str(exc))
        return
    state = task.status.state
    open_task = state not in FAILED_STATES and state != pb.TASK_STATE_COMPLETED
    # What is kept of the task: its id, and for one to look at again its context id.
    if why := unheld(task.id, "task_id") or (unheld(task.context_id, "context_id") if open_task else ""):
        actions.record_attempts(call_id=call.pk, attempts=attempts)
        fail(call, "remote_error", f"{call.agent_name} answered {why}.")
        return
    if state == pb.TASK_STATE_COMPLETED:
        actions.record_attempts(call_id=call.pk, attempts=attempts)
        actions.settle_remote_call(
            call_id=call.pk, status=RemoteCall.Status.COMPLETED, reply=reply_of(task), task_id=task.id
        )
    elif state in FAILED_STATES:
        actions.record_attempts(call_id=call.pk, attempts=attempts)
        why = text_of(task.status.message.parts) or pb.TaskState.Name(state)
        actions.settle_remote_call(
            call_id=call.pk, status=RemoteCall.Status.FAILED, task_id=task.id,
            error={"code": FAILED_STATES[state], "message": f"{call.agent_name}: {why}"[:2000]},
        )  # fmt: skip
    elif not task.id:  # nothing to look at again, and sending again would send the message twice
        actions.record_attempts(call_id=call.pk, attempts=attempts)
        fail(call, "remote_error", f"{call.agent_name} answered {pb.TaskState.Name(state)} without a task id.")
    else:  # submitted or working: look again soon
        polls = max(0, attempts - 1)
        delay = min(POLL_S[min(polls, len(POLL_S) - 1)], remaining_s(call) + 0.05)
        actions.schedule_remote_step(
            call=call, delay_s=delay, failures=0, attempts=attempts, task_id=task.id, context_id=task.context_id
        )


async def leased(call: RemoteCall, exchange: Coroutine[Any, Any, pb.Task]) -> pb.Task:
    """The exchange, with the step's lease (AGORA_LEASE_S) renewed every third of it while the
    exchange runs, as the heartbeat renews a turn's: a slow remote agent leaves the step with its
    live worker, and a dead worker's step lapses within seconds for the reconciler to ring again."""
    running = asyncio.ensure_future(exchange)
    while not (await asyncio.wait({running}, timeout=settings.AGORA_LEASE_S / 3))[0]:
        await asyncio.to_thread(renew, call)
    return running.result()


def renew(call: RemoteCall) -> None:
    """One renewal, on a thread of the exchange's loop and its own connection (closed after: a slow
    exchange renews a few times, most renew never). A failed one is tried again at the next third."""
    try:
        actions.renew_remote_step(call_id=call.pk, step=call.step, lease_s=settings.AGORA_LEASE_S)
    except (DatabaseError, InterfaceError):  # the database is away: the next third tries again
        logger.exception("remote call %s: its step's lease renewal failed", call.pk)
    finally:
        connection.close()


def fail(call: RemoteCall, code: str, message: str) -> None:
    error = {"code": code, "message": message}
    actions.settle_remote_call(call_id=call.pk, status=RemoteCall.Status.FAILED, error=error)


def remaining_s(call: RemoteCall) -> float:
    return max(0.0, (call.deadline - timezone.now()).total_seconds())


def message_of(call: RemoteCall) -> pb.Message:
    """The call's message: a string is a text part, any other JSON value a data part."""
    part = pb.Part()
    if isinstance(call.message, str):
        part.text = call.message
    elif isinstance(call.message, dict):
        part.data.struct_value.update(call.message)
    elif isinstance(call.message, list):
        part.data.list_value.extend(call.message)
    elif isinstance(call.message, bool):
        part.data.bool_value = call.message
    elif isinstance(call.message, int | float):
        part.data.number_value = call.message
    return pb.Message(message_id=call.pk, role=pb.ROLE_USER, parts=[part])


def value_of(part: pb.Part) -> Any:
    """A part as JSON: text as a string, data as its value, anything else as the part's JSON form."""
    kind = part.WhichOneof("content")
    if kind == "text":
        return part.text
    body = MessageToDict(part)
    return body.get("data") if kind == "data" else body


def unheld(value: str, column: str) -> str:
    """Why the call's column cannot hold a task's id (too long, or text no database stores), or ""."""
    if len(value) > (getattr(RemoteCall._meta.get_field(column), "max_length", None) or 0) or text_problem(value):
        return f"a {column.replace('_', ' ')} no column holds ({len(value)} characters)"
    return ""


def text_of(parts: Any) -> str:
    return " ".join(part.text for part in parts if part.WhichOneof("content") == "text").strip()


def reply_of(task: pb.Task) -> Any:
    """A finished task's answer: the parts of its artifacts (else of its status message); one part
    is its value, several a list of their values."""
    parts = [part for artifact in task.artifacts for part in artifact.parts] or list(task.status.message.parts)
    values = [value_of(part) for part in parts]
    return values[0] if len(values) == 1 else values


def headers_for(token_env: str) -> dict[str, str]:
    if not token_env:
        return {}
    token = os.environ.get(token_env, "")
    if not token:
        raise Refused("remote_unauthorized", f"The workers' environment has no {token_env} for this remote agent.")
    return {"Authorization": f"Bearer {token}"}


def remote_http(token_env: str) -> httpx.AsyncClient:
    """The HTTP client of one exchange with a remote agent: its token, its timeout, and every request
    screened (unless private addresses are allowed), not only the allowed URL: the agent's card names
    the address its messages go to, and a card may name a private one; each connection is then made
    only to the public address its host was found at (public_net)."""
    if settings.AGORA_A2A_REMOTE_PRIVATE_URLS:
        return httpx.AsyncClient(headers=headers_for(token_env), timeout=HTTP_TIMEOUT_S)
    return httpx.AsyncClient(
        headers=headers_for(token_env), timeout=HTTP_TIMEOUT_S, event_hooks={"request": [screen]},
        transport=async_public_transport(),
    )  # fmt: skip


async def screen(request: httpx.Request) -> None:
    """Refuse a request to anything but a public address (checked when a manager allowed the agent,
    and again at each request: a name may resolve elsewhere since, and its card may name another)."""
    if not await validate_push_notification_url(str(request.url)):
        raise Refused("remote_not_allowed", f"{request.url} is not at a public address.")


def screened_out(exc: BaseException) -> "Refused | None":
    """screen()'s refusal, or the connection's (public_net), however the client wrapped it."""
    seen: BaseException | None = exc
    while seen is not None and not isinstance(seen, Refused | NotPublic):
        seen = seen.__cause__ or seen.__context__
    if isinstance(seen, NotPublic):
        return Refused("remote_not_allowed", str(seen))
    return seen


async def exchange(call: RemoteCall, token_env: str) -> pb.Task:
    """Send the call's message (return at once), or read its remote task: one exchange."""
    remote = remote_http(token_env)
    try:
        try:
            async with remote as http:
                client = await create_client(call.url, ClientConfig(httpx_client=http, streaming=False))
                try:
                    if call.task_id:
                        return await client.get_task(pb.GetTaskRequest(id=call.task_id))
                    return await send(client, call)
                finally:
                    await client.close()
        except Exception as exc:
            if (refused := screened_out(exc)) is not None:
                raise refused from None
            raise
    except A2AClientTimeoutError as exc:
        raise Transient(f"no answer within {HTTP_TIMEOUT_S:g} s") from exc
    except AgentCardResolutionError as exc:
        if exc.status_code is None or exc.status_code >= 500 or exc.status_code == 429:
            raise Transient(f"its agent card: {exc.message}") from exc
        why = f"{call.agent_name} has no agent card at {call.url} ({exc.status_code})."
        raise Refused("remote_error", why) from exc
    except A2AClientError as exc:
        cause = exc.__cause__
        if isinstance(cause, httpx.HTTPStatusError):
            status = cause.response.status_code
            if status < 500 and status not in (408, 429):
                code = "remote_unauthorized" if status in (401, 403) else "remote_error"
                raise Refused(code, f"{call.agent_name} answered HTTP {status}.") from exc
        raise Transient(str(exc)) from exc
    except A2AError as exc:  # a JSON-RPC error of the remote agent: it refused this call
        raise Refused("remote_error", f"{call.agent_name}: {exc}"[:2000]) from exc
    except httpx.HTTPError as exc:
        raise Transient(f"{type(exc).__name__}: {exc}") from exc


async def send(client: Any, call: RemoteCall) -> pb.Task:
    request = pb.SendMessageRequest(message=message_of(call))
    request.configuration.return_immediately = True
    async for response in client.send_message(request):
        if response.HasField("task"):
            return response.task
        if response.HasField("message"):  # an answer without a task: the call is done with it
            task = pb.Task(id="", context_id=response.message.context_id)
            task.status.state = pb.TASK_STATE_COMPLETED
            task.status.message.CopyFrom(response.message)
            return task
    raise Transient("the remote agent sent no task")


def cancel_quietly(call: RemoteCall, token_env: str) -> None:
    """At the deadline, ask the remote agent to stop the task (what it answers changes nothing)."""

    async def cancel() -> None:
        async with remote_http(token_env) as http:
            client = await create_client(call.url, ClientConfig(httpx_client=http, streaming=False))
            try:
                await client.cancel_task(pb.CancelTaskRequest(id=call.task_id))
            finally:
                await client.close()

    try:
        asyncio.run(cancel())
    except (A2AError, Refused, NotPublic, httpx.HTTPError) as exc:
        logger.info("cancelling remote task %s of call %s: %s", call.task_id, call.pk, exc)
