"""A saga's beginning and its end: created with its owner as first collaborator; finished
(`completed` or `cancelled`) by a manager, which ends everything still at work in it."""

from django.db import IntegrityError, transaction
from guardian.shortcuts import assign_perm

from accounts.models import User
from journal.actions import record
from sagas import errors
from sagas.access import may_manage
from sagas.actions.collaborators import actor_id
from sagas.actions.human_forms import cancel_forms
from sagas.actions.locking import lock_saga
from sagas.actions.payloads import body_hash, check_goal, first_for_key
from sagas.actions.requests import Status, close_request, settle
from sagas.actions.runs import finish_run
from sagas.actions.teams import shutdown_team
from sagas.models import AgentRequest, Collaborator, HumanRequest, Run, Saga, Team

TITLE_MAX = 200  # Saga.title's max_length
FINISHED = (Saga.Status.COMPLETED, Saga.Status.CANCELLED)


def create_saga_once(
    *, title: str, goal: str = "", policy: str = Saga.Policy.TREE, owner: User, idempotency_key: str = ""
) -> tuple[Saga, bool]:
    """create_saga() once per Idempotency-Key of its owner (without one, every call creates): a
    retry with the same key and body returns the first saga (and False), with another body it is
    `idempotency_conflict`. Of two retries at once, the key's unique constraint lets one create the
    saga; the other returns it."""
    if not idempotency_key:
        return create_saga(title=title, goal=goal, policy=policy, owner=owner), True
    for _ in range(2):
        first = first_for_key(
            Saga.objects.filter(owner=owner, idempotency_key=idempotency_key),
            saga_body_hash(title, goal, policy),
            conflict="This Idempotency-Key was used for another saga.",
        )
        if first is not None:
            return first, False
        try:
            with transaction.atomic():
                return create_saga(
                    title=title, goal=goal, policy=policy, owner=owner, idempotency_key=idempotency_key
                ), True
        except IntegrityError:
            continue  # the other one created it meanwhile: found above, this time
    raise errors.IdempotencyConflict("This Idempotency-Key is in use by a saga being created.")


def saga_body_hash(title: str, goal: str, policy: str) -> str:
    return body_hash(title=title, goal=goal, policy=policy)


@transaction.atomic
def create_saga(
    *, title: str, goal: str = "", policy: str = Saga.Policy.TREE, owner: User, idempotency_key: str = ""
) -> Saga:
    """A new saga, its owner its first collaborator; `idempotency_key`: the one it is created for,
    stored with the hash of its body (create_saga_once())."""
    if not title.strip():
        raise errors.InvalidPayload("A saga needs a title.", errors={"title": ["This field may not be blank."]})
    if len(title) > TITLE_MAX:
        raise errors.InvalidPayload("The title is too long.", errors={"title": ["At most 200 characters."]})
    check_goal(goal, field="goal")
    if policy not in Saga.Policy.values:
        raise errors.InvalidPayload(f"Unknown policy {policy!r}.", errors={"policy": [f"One of {Saga.Policy.values}."]})
    digest = saga_body_hash(title, goal, policy) if idempotency_key else ""
    saga = Saga.objects.create(
        title=title, goal=goal, policy=policy, owner=owner, idempotency_key=idempotency_key, body_hash=digest
    )
    for perm in ("sagas.view_saga", "sagas.manage_saga"):
        assign_perm(perm, owner, saga)
    record(
        saga_id=saga.pk,
        type="saga.created",
        actor=f"human:{owner.username}",
        data={"title": title, "goal": goal, "policy": policy},
    )
    Collaborator.objects.create(
        saga=saga, kind=Collaborator.Kind.HUMAN, name=owner.username, role="Owner", task=goal, user=owner
    )
    record(
        saga_id=saga.pk,
        type="collaborator.joined",
        actor=f"human:{owner.username}",
        data={"id": f"human:{owner.username}", "kind": "human", "role": "Owner", "task": goal},
    )
    return saga


@transaction.atomic
def finish_saga(*, saga: Saga, status: str, by: User, reason: str = "") -> Saga:
    """A manager ends the saga, `completed` or `cancelled`, in one transaction: journaled as
    `saga.finished`, then its teams shut down (teammates terminal, what they were asked fails with
    `recipient_unavailable`, what they asked is cancelled), every other run still at work
    cancelled, the requests still open after that cancelled and its pending forms withdrawn.
    From then on every write that would start work is refused (`saga_finished`, see
    lock_open_saga); reads go on. Finishing it again with the same status changes nothing; with
    the other status it is refused (`saga_finished`)."""
    saga = lock_saga(saga.pk)
    if not may_manage(by, saga):
        raise errors.Forbidden("Only managers of the saga finish it.")
    if status not in FINISHED:
        raise errors.InvalidPayload("Bad status.", errors={"status": ["completed or cancelled."]})
    check_goal(reason, field="reason")
    if saga.is_finished:
        if saga.status == status:
            return saga
        raise errors.SagaFinished(f"The saga is already {saga.status}.", saga_status=saga.status)
    Saga.objects.filter(pk=saga.pk, status=Saga.Status.OPEN).update(status=status)
    saga.status = status
    actor = actor_id(saga, by)
    record(saga_id=saga.pk, type="saga.finished", actor=actor, data={"status": status, "reason": reason, "by": actor})
    why = f"The saga was {status}" + (f": {reason}" if reason else ".")
    for team in Team.objects.filter(saga=saga).select_related("saga").order_by("created_at", "pk"):
        shutdown_team(team=team, reason=why, actor=actor)
    at_work = Run.objects.filter(collaborator__saga=saga).exclude(status__in=Run.FINISHED)
    for run in at_work.select_related("collaborator").order_by("created_at", "pk"):
        finish_run(run=run, status=Run.Status.CANCELLED, error=why, actor=actor)
    # Every run has ended, which failed what was asked of it; what is left has no one to answer it.
    still_open = AgentRequest.objects.filter(saga=saga, status__in=AgentRequest.OPEN)
    for request in still_open.select_related("sender", "recipient").order_by("created_at", "pk"):
        if settle(request, Status.CANCELLED, error={"code": errors.SagaFinished.code, "message": why}):
            close_request(request, actor=actor, notify_recipient=False)
    cancel_forms(HumanRequest.objects.filter(saga=saga), actor=actor)
    return saga
