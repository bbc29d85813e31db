"""A saga's beginning: created with its owner as first collaborator."""

from django.db import transaction
from guardian.shortcuts import assign_perm

from accounts.models import User
from journal.actions import record
from sagas import errors
from sagas.actions.payloads import check_goal
from sagas.models import Collaborator, Saga

TITLE_MAX = 200  # Saga.title's max_length


@transaction.atomic
def create_saga(*, title: str, goal: str = "", policy: str = Saga.Policy.TREE, owner: User) -> Saga:
    if not title.strip():
        raise errors.InvalidPayload("A saga needs a title.", errors={"title": ["This field may not be blank."]})
    if len(title) > TITLE_MAX:
        raise errors.InvalidPayload("The title is too long.", errors={"title": ["At most 200 characters."]})
    check_goal(goal, field="goal")
    if policy not in Saga.Policy.values:
        raise errors.InvalidPayload(f"Unknown policy {policy!r}.", errors={"policy": [f"One of {Saga.Policy.values}."]})
    saga = Saga.objects.create(title=title, goal=goal, policy=policy, owner=owner)
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
