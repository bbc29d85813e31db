"""Cancelling a running prompt: a manager of its saga ends it, and the work it started with it.
Its own module: it moves the prompt as a step does (`steps`), which the submission's actions feed."""

from uuid import UUID

from accounts.models import User
from agents.orchestrator import steps
from agents.orchestrator.models import Prompt
from agents.orchestrator.reads import at_work_under
from sagas import actions, errors
from sagas.access import may_manage
from sagas.models import Run, Saga


def cancel_prompt(*, prompt_id: UUID, by: User) -> Prompt:
    """End a running prompt in one saga transaction: it fails with the reason `Cancelled by …`
    (journaled `prompt.failed`), and every run it started that is still at work (its support
    workers, the primary, the reviewer, and whom they delegated) is cancelled, with the requests
    each sent and the forms each asked (actions.end_run()). A worker whose model call is in flight
    loses its turn at its next write: its answer is dropped, and no step comes after (each finds
    the prompt done). A prompt that has ended is refused (`invalid_state`, naming its status); one
    the caller may not see is `not_found`, and only managers of the saga cancel (`forbidden`).
    Returns the prompt as committed."""
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
        actor = actions.actor_id(prompt.saga, by)
        reason = f"Cancelled by {actor}."
        steps.move(prompt, step, Prompt.Step.DONE, status=Prompt.Status.FAILED, reason=reason)  # held: it moves
        for run in at_work_under(prompt):
            actions.end_run(run=run, status=Run.Status.CANCELLED, reason=reason, actor=actor)
        steps.conclude(prompt, Prompt.Status.FAILED, reason=reason)
    prompt.refresh_from_db()
    return prompt
