"""The kernel's writes. Each action commits its journal events together with its state change."""

from django.db import transaction
from guardian.shortcuts import assign_perm

from accounts.models import User
from journal.actions import record
from sagas.models import Saga


@transaction.atomic
def create_saga(*, title: str, goal: str = "", policy: str = Saga.Policy.TREE, owner: User) -> Saga:
    saga = Saga.objects.create(title=title, goal=goal, policy=policy, owner=owner)
    for perm in ("sagas.view_saga", "sagas.manage_saga"):
        assign_perm(perm, owner, saga)
    record(
        saga_id=saga.pk,
        type="saga.created",
        actor=f"human:{owner.username}",
        data={"title": title, "goal": goal, "policy": policy},
    )
    return saga
