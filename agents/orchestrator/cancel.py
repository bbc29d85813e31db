"""Cancelling a running prompt: a manager of its saga ends it, and the work it started with it."""

from typing import Any

from accounts.models import User
from agents.orchestrator import steps
from agents.orchestrator.models import Prompt
from sagas import actions, errors
from sagas.access import may_manage
from sagas.models import Delegation, Run, Saga


def cancel_prompt(*, prompt_id: Any, by: User) -> Prompt:
    """End a running prompt in one saga transaction: it fails with the reason `Cancelled by …`
    (journaled `prompt.failed`), and every run it started that is still at work (its support
    workers, the primary, the reviewer, and whom they delegated) is cancelled, with what each was
    waiting for. A worker whose model call is in flight loses its turn at its next write: its
    answer is dropped, and no step comes after (each finds the prompt done). A prompt that has
    ended is refused (`invalid_state`, naming its status); one the caller may not see is
    `not_found`, and only managers of the saga cancel (`forbidden`)."""
    visible = Saga.objects.visible_to(by)
    prompt = Prompt.objects.select_related("saga", "brain", "lead__run").filter(pk=prompt_id, saga__in=visible).first()
    if prompt is None:
        raise errors.NotFound(f"No prompt {prompt_id}.")
    if not may_manage(by, prompt.saga):
        raise errors.Forbidden("Only managers of the saga cancel prompts.")
    with actions.saga_transaction(prompt.saga):
        # Read again under the saga's lock, which every step takes to move it: it stays as read.
        step, status = Prompt.objects.filter(pk=prompt.pk).values_list("step", "status").get()
        if step == Prompt.Step.DONE:
            raise errors.InvalidState(f"The prompt has ended: it is {status}.")
        actor = f"{by.kind}:{by.username}"
        reason = f"Cancelled by {actor}."
        steps.move(prompt, step, Prompt.Step.DONE, status=Prompt.Status.FAILED, reason=reason)
        for run in at_work_under(prompt):
            actions.end_run(run, status=Run.Status.CANCELLED, reason=reason, actor=actor)
        steps.conclude(prompt, Prompt.Status.FAILED, reason=reason)
    return prompt


def at_work_under(prompt: Prompt) -> list[Run]:
    """The runs still at work among the lead's delegates and theirs, oldest first."""
    found: list[int] = []
    frontier = [prompt.lead_id] if prompt.lead_id else []
    while frontier:
        frontier = list(Delegation.objects.filter(delegator_id__in=frontier).values_list("delegate_id", flat=True))
        found += frontier
    at_work = Run.objects.filter(collaborator_id__in=found).exclude(status__in=Run.FINISHED)
    return list(at_work.select_related("collaborator").order_by("created_at", "pk"))
