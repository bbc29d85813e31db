"""Remote A2A agents: the endpoints a manager allows per saga, and the calls agents make to them
(`ask_remote_agent`). The protocol work (sending, following the remote task) is a Celery task's,
rung by name after commit; every state change it makes goes through the actions here."""

import math
import re
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from a2a.utils.push_url_validator import validate_push_notification_url
from asgiref.sync import async_to_sync
from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import URLValidator
from django.db import IntegrityError, transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from accounts.models import User
from config.payloads import storable_value
from journal.actions import record
from sagas import errors
from sagas.access import may_manage
from sagas.actions.collaborators import NAME_RE, actor_id
from sagas.actions.locking import lock_saga
from sagas.actions.payloads import check_payload
from sagas.actions.steering import push_steering
from sagas.models import Collaborator, Run, Saga, SteeringItem
from sagas.remotes import RemoteAgent, RemoteCall
from sagas.wakeups import ring_remote_call_after_commit, ring_run_after_commit

ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,99}")
URL_MAX = 2000
Status = RemoteCall.Status


# --- the endpoints a manager allows ----------------------------------------------------------


def check_remote_url(url: Any) -> str:
    """An http(s) URL without credentials in it; at a public address unless
    `AGORA_A2A_REMOTE_PRIVATE_URLS` allows loopback and private ones (the rule push notifications
    follow, with the SDK's own screening: the host must resolve, and only to public addresses)."""

    def bad(message: str) -> errors.KernelError:
        return errors.InvalidPayload("Bad remote agent URL.", errors={"url": [message]})

    if not isinstance(url, str) or not url or len(url) > URL_MAX:
        raise bad(f"An http(s) URL of at most {URL_MAX} characters.")
    try:
        URLValidator(schemes=["http", "https"])(url)
        parts = urlsplit(url)
        (parts.hostname or "").encode("idna")  # a label no resolver takes (UnicodeError, a ValueError)
    except (ValidationError, ValueError):
        raise bad("An http(s) URL.") from None
    if parts.username or parts.password:
        raise bad("No credentials in the URL: name the variable that holds the token instead.")
    if not settings.AGORA_A2A_REMOTE_PRIVATE_URLS and not async_to_sync(validate_push_notification_url)(url):
        raise bad("Not a public address: loopback, private and unresolvable hosts are refused.")
    return url


def remote_agents_of(saga: Saga) -> QuerySet[RemoteAgent]:
    return RemoteAgent.objects.filter(saga=saga).order_by("name")


@transaction.atomic
def allow_remote_agent(*, saga: Saga, name: str, url: str, token_env: str = "", by: User) -> RemoteAgent:
    """A manager allows the saga's agents to call the A2A agent at `url`, by `name`."""
    saga = lock_saga(saga.pk)
    if not may_manage(by, saga):
        raise errors.Forbidden("Only managers of the saga allow remote agents.")
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise errors.InvalidPayload("Bad name.", errors={"name": ["Lowercase letters, digits, '.', '_' and '-'."]})
    if not isinstance(token_env, str) or (token_env and not ENV_NAME_RE.fullmatch(token_env)):
        raise errors.InvalidPayload(
            "Bad token variable.", errors={"token_env": ["The name of an environment variable, or nothing."]}
        )
    url = check_remote_url(url)
    taken = remote_agents_of(saga).filter(Q(name=name) | Q(url=url)).first()
    if taken is not None:
        field = "name" if taken.name == name else "url"
        raise errors.NameTaken(f"This saga already allows {taken.name} ({taken.url}).", errors={field: ["Taken."]})
    actor = actor_id(saga, by)
    try:
        with transaction.atomic():
            remote = RemoteAgent.objects.create(saga=saga, name=name, url=url, token_env=token_env, added_by=actor)
    except IntegrityError:  # the lock makes this unlikely; the constraint makes it certain
        raise errors.NameTaken(f"This saga already allows {name}.") from None
    record(saga_id=saga.pk, type="remote_agent.allowed", actor=actor,
           data={"remote": name, "url": url, "token_env": token_env})  # fmt: skip
    return remote


@transaction.atomic
def remove_remote_agent(*, saga: Saga, name: str, by: User) -> None:
    """A manager withdraws the permission: no new call to it, and its open calls fail at their next step."""
    saga = lock_saga(saga.pk)
    if not may_manage(by, saga):
        raise errors.Forbidden("Only managers of the saga remove remote agents.")
    remote = remote_agents_of(saga).filter(name=name).first()
    if remote is None:
        raise errors.NotFound(f"No remote agent {name} in this saga.")
    remote.delete()
    record(saga_id=saga.pk, type="remote_agent.removed", actor=actor_id(saga, by), data={"remote": name})


# --- calls -------------------------------------------------------------------------------------


def allowed_remote(caller: Collaborator, agent: Any) -> RemoteAgent:
    """The endpoint an agent names: by its name, or by a URL equal to an allowed one. Anything
    else is refused (`remote_not_allowed`) before anything is written or sent."""
    allowed = list(remote_agents_of(caller.saga))
    found = next((r for r in allowed if isinstance(agent, str) and agent in (r.name, r.url)), None)
    if found is None:
        names = ", ".join(r.name for r in allowed) or "none"
        raise errors.RemoteNotAllowed(f"{agent!r} is not a remote agent this saga allows (allowed: {names}).")
    return found


def check_timeout(timeout_s: Any) -> float:
    if timeout_s is None:
        return float(settings.AGORA_A2A_REMOTE_TIMEOUT_S)
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or not math.isfinite(timeout_s):
        raise errors.InvalidPayload("Bad timeout.", errors={"timeout_s": ["A number of seconds."]})
    if timeout_s <= 0:
        raise errors.InvalidPayload("Bad timeout.", errors={"timeout_s": ["Must be positive."]})
    return min(float(timeout_s), settings.AGORA_A2A_REMOTE_MAX_TIMEOUT_S)


@transaction.atomic
def call_remote_agent(
    *,
    caller: Collaborator,
    agent: Any,
    message: Any,
    mode: str = RemoteCall.Mode.ASYNC,
    timeout_s: Any = None,
    idempotency_key: str = "",
) -> tuple[RemoteCall, bool]:
    """Register a durable call to an allowed remote agent; returns it and whether it is new.

    The call is sent by a Celery task after commit; within `timeout_s` (default
    `AGORA_A2A_REMOTE_TIMEOUT_S`, at most `AGORA_A2A_REMOTE_MAX_TIMEOUT_S`) the remote task must
    end, or the call fails with `timeout`. The same idempotency key returns the first call.
    """
    if not caller.is_agent:
        raise errors.Forbidden("Only agents call remote agents.")
    lock_saga(caller.saga_id)
    if idempotency_key and (first := RemoteCall.objects.filter(caller=caller, idempotency_key=idempotency_key).first()):
        return first, False
    if mode not in RemoteCall.Mode.values:
        raise errors.InvalidPayload("Bad mode.", errors={"mode": ["async or wait."]})
    if message is None or message == "" or message == {}:
        raise errors.InvalidPayload("A call needs a message.", errors={"message": ["Text or any JSON value."]})
    check_payload(message, field="message")
    wait_s = check_timeout(timeout_s)
    remote = allowed_remote(caller, agent)
    limit = settings.AGORA_A2A_REMOTE_MAX_OPEN
    if RemoteCall.objects.filter(caller=caller, status__in=RemoteCall.OPEN).count() >= limit:
        raise errors.TooManyPending(f"{caller.handle} already has {limit} remote calls open.", limit=limit)
    now = timezone.now()
    call = RemoteCall.objects.create(
        saga_id=caller.saga_id, caller=caller, remote_agent=remote, agent_name=remote.name, url=remote.url,
        message=message, mode=mode, idempotency_key=idempotency_key, deadline=now + timedelta(seconds=wait_s),
        next_step_at=now,
    )  # fmt: skip
    record(
        saga_id=caller.saga_id, type="remote_request", actor=caller.handle,
        data={"call_id": call.pk, "remote": remote.name, "url": remote.url, "mode": mode, "timeout_s": wait_s,
              "message": message},
    )  # fmt: skip
    ring_remote_call_after_commit(call.pk, 0)
    return call, True


@transaction.atomic(savepoint=False)
def park_on_remote(*, run: Run, turn: int, call_id: str, tool_call_id: str) -> None:
    """Remember which tool call waits on the remote call; the turn parks at its end (end_turn)."""
    Run.objects.filter(pk=run.pk, status=Run.Status.RUNNING, turn=turn).update(
        waiting_on_remote_id=call_id, wait_tool_call_id=tool_call_id
    )
    run.waiting_on_remote_id, run.wait_tool_call_id = call_id, tool_call_id


def remote_outcome(call: RemoteCall) -> dict[str, Any]:
    """What the calling agent learns: the reply, or the error, or that it is still under way."""
    body: dict[str, Any] = {"call_id": call.pk, "agent": call.agent_name, "status": call.status}
    if call.task_id:
        body["task_id"] = call.task_id
    if call.status == Status.COMPLETED:
        body["reply"] = call.reply
    elif call.error:
        body["error"] = call.error
    return body


@transaction.atomic
def settle_remote_call(
    *, call_id: str, status: str, reply: Any = None, error: dict[str, Any] | None = None, task_id: str = ""
) -> bool:
    """The call's one terminal transition (compare-and-set): journaled as `remote_reply`; a run
    parked on it is resumed (its tool call gets the outcome), anyone else gets it in steering. The
    reply and the error are the remote agent's words: kept with U+FFFD for what no column stores."""
    if status not in (Status.COMPLETED, Status.FAILED):
        raise errors.InvalidPayload(f"{status} is not a terminal remote call status.")
    reply, error = storable_value(reply), storable_value(error)
    call = RemoteCall.objects.select_related("caller").filter(pk=call_id).first()
    if call is None:
        return False
    lock_saga(call.saga_id)
    now = timezone.now()
    changes: dict[str, Any] = {"status": status, "reply": reply, "error": error, "lease_until": None, "updated_at": now}
    if task_id:
        changes["task_id"] = task_id
    if not RemoteCall.objects.filter(pk=call_id, status__in=RemoteCall.OPEN).update(**changes):
        return False
    call.refresh_from_db()
    record(
        saga_id=call.saga_id, type="remote_reply", actor=call.caller.handle,
        data={"call_id": call.pk, "remote": call.agent_name, "status": status, "task_id": call.task_id,
              "reply": reply, "error": error, "attempts": call.attempts,
              "duration_ms": round((now - call.created_at).total_seconds() * 1000, 1)},
    )  # fmt: skip
    parked = Run.objects.filter(collaborator=call.caller, waiting_on_remote=call).values_list("pk", flat=True).first()
    if parked is not None:  # its tool call's result, read when the run resumes
        if Run.objects.filter(pk=parked, status=Run.Status.WAITING).update(status=Run.Status.QUEUED, wait_until=None):
            ring_run_after_commit(parked)
    else:
        push_steering(recipient=call.caller, kind=SteeringItem.Kind.RESPONSE, sender=f"remote:{call.agent_name}",
                      payload=remote_outcome(call))  # fmt: skip
    return True


def time_out_remote_call(call: RemoteCall) -> None:
    """A parked wait whose deadline passed before the follower ended the call: it ends here."""
    settle_remote_call(
        call_id=call.pk, status=Status.FAILED,
        error={"code": "timeout", "message": f"{call.agent_name} did not finish within the call's timeout."},
    )  # fmt: skip
    call.refresh_from_db()


# --- the follower's steps (gateways.a2a.outbound) ---------------------------------------------


def claim_remote_step(*, call_id: str, step: int, lease_s: float) -> RemoteCall | None:
    """Compare-and-set: this doorbell's step of an open call, unless another holds a live lease
    or a later step was already claimed (a duplicated doorbell). Returns the call, with its endpoint
    and its caller's run."""
    now = timezone.now()
    claimed = (
        RemoteCall.objects.filter(pk=call_id, step=step, status__in=RemoteCall.OPEN)
        .filter(Q(lease_until__isnull=True) | Q(lease_until__lt=now))
        .update(step=step + 1, lease_until=now + timedelta(seconds=lease_s), updated_at=now)
    )
    if not claimed:
        return None
    return RemoteCall.objects.select_related("remote_agent", "caller__run").get(pk=call_id)


def renew_remote_step(*, call_id: str, step: int, lease_s: float) -> bool:
    """Extend the lease of a step whose exchange is still running (claim_remote_step()'s `step`
    + 1, as the call holds it); False once the call has moved on or ended."""
    now = timezone.now()
    held = RemoteCall.objects.filter(pk=call_id, step=step, status__in=RemoteCall.OPEN, lease_until__isnull=False)
    return bool(held.update(lease_until=now + timedelta(seconds=lease_s)))


def schedule_remote_step(
    *, call: RemoteCall, delay_s: float, failures: int, attempts: int, task_id: str = "", context_id: str = ""
) -> bool:
    """After a step that did not end the call: record what it learnt (the remote task's id: the
    call is `working`) and when the next step is due; its doorbell rings after this commits."""
    now = timezone.now()
    changes: dict[str, Any] = {"lease_until": None, "next_step_at": now + timedelta(seconds=delay_s),
                               "failures": failures, "attempts": attempts, "updated_at": now}  # fmt: skip
    if task_id and not call.task_id:
        changes.update(task_id=task_id, context_id=context_id, status=Status.WORKING)
    with transaction.atomic():
        moved = RemoteCall.objects.filter(pk=call.pk, step=call.step, status__in=RemoteCall.OPEN).update(**changes)
        if moved:
            ring_remote_call_after_commit(call.pk, call.step, delay_s=delay_s)
    return bool(moved)


def record_attempts(*, call_id: str, attempts: int) -> None:
    RemoteCall.objects.filter(pk=call_id).update(attempts=attempts)


def due_remote_calls(now: datetime) -> list[tuple[str, int]]:
    """Open calls whose next step should have run and did not (a lost doorbell, a dead worker):
    (id, step) pairs for the reconciler to ring again. Each is marked as due now (compare-and-set),
    so that it is rung again at most once per `AGORA_RERING_S`."""
    late = now - timedelta(seconds=settings.AGORA_RERING_S)
    due = Q(lease_until__isnull=True, next_step_at__lt=late) | Q(lease_until__lt=now)
    rung = []
    for call_id, step in RemoteCall.objects.filter(due, status__in=RemoteCall.OPEN).values_list("pk", "step")[:500]:
        marked = RemoteCall.objects.filter(due, pk=call_id, step=step, status__in=RemoteCall.OPEN)
        if marked.update(lease_until=None, next_step_at=now):
            rung.append((call_id, step))
    return rung
