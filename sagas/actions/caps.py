"""Caps that keep one agent (or one saga) from multiplying its share: delegates and open forms.

Each budget elsewhere is per collaborator (64 open requests per sender, a steering backlog per
recipient), so an agent that could add delegates without end, or open forms without end, could
multiply them. Counted under the saga's lock (every caller holds it), so two additions at the same
instant cannot both slip under a cap.
"""

from django.conf import settings

from sagas import errors
from sagas.access import Member, Node, SagaTree
from sagas.models import Collaborator, HumanRequest, Saga


def check_delegate_caps(tree: SagaTree[Member], delegator: Node, *, adding: int = 1) -> None:
    """An agent has at most `AGORA_MAX_DELEGATES_PER_AGENT` delegates, a saga at most
    `AGORA_MAX_AGENTS_PER_SAGA` agents; past either, `too_many_delegates` (429). Teammates are
    counted by their team's own cap (`sagas.actions.teams`), which a manager sets, not here.
    `tree`: the saga as read under its lock; `adding`: how many are added at once (all must fit)."""
    per_agent, per_saga = settings.AGORA_MAX_DELEGATES_PER_AGENT, settings.AGORA_MAX_AGENTS_PER_SAGA
    if delegator.is_agent:
        delegates = tree.children().get(delegator.pk, [])
        if sum(1 for c in delegates if tree.members[c].team_id is None) + adding > per_agent:
            raise errors.TooManyDelegates(f"{delegator.handle} already has {per_agent} delegates.", limit=per_agent)
    if sum(1 for c in tree.members.values() if c.is_agent) + adding > per_saga:
        raise errors.TooManyDelegates(f"This saga already has {per_saga} agents.", limit=per_saga)


def check_form_caps(saga: Saga, asker: Collaborator) -> None:
    """An agent has at most `AGORA_MAX_OPEN_FORMS_PER_AGENT` unanswered forms, a saga at most
    `AGORA_MAX_OPEN_FORMS_PER_SAGA`; past either, `too_many_pending` (429), as for requests."""
    per_agent, per_saga = settings.AGORA_MAX_OPEN_FORMS_PER_AGENT, settings.AGORA_MAX_OPEN_FORMS_PER_SAGA
    pending = HumanRequest.objects.filter(saga=saga, status=HumanRequest.Status.PENDING)
    if pending.filter(asker=asker).count() >= per_agent:
        raise errors.TooManyPending(f"{asker.handle} already has {per_agent} unanswered forms.", limit=per_agent)
    if pending.count() >= per_saga:
        raise errors.TooManyPending(f"This saga already has {per_saga} unanswered forms.", limit=per_saga)
