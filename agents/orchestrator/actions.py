"""The orchestrator's writes: submitting a prompt and loading brains. Step transitions live in
`steps`, each a compare-and-set in a saga transaction."""

import logging
from functools import partial
from typing import Any
from urllib.parse import urlsplit

from celery import current_app
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from kombu.exceptions import OperationalError as BrokerError
from redis.exceptions import RedisError

from accounts.models import User
from agents.actions import repeated
from agents.orchestrator.models import Brain, Prompt
from agents.orchestrator.router import vision_roles
from agents.references import check_references
from journal.actions import record
from sagas import actions, errors
from sagas.access import may_manage
from sagas.models import Collaborator, Saga

logger = logging.getLogger(__name__)

ADVANCE_TASK = "agents.orchestrator.advance_prompt"
MAX_PROMPT_CHARS = 20_000
MAX_IMAGES, MAX_IMAGE_URL = 8, 2000  # images a prompt carries, and the characters of each one's URL


def ring_prompt(prompt_id: str) -> None:
    """The doorbell of one orchestration; losing it delays it, the periodic resume rings again."""
    try:
        current_app.send_task(ADVANCE_TASK, args=[prompt_id])
    except (BrokerError, RedisError, OSError) as exc:
        logger.warning("could not ring prompt %s (the resume will): %s", prompt_id, exc)


def ring_prompt_after_commit(prompt_id: str) -> None:
    transaction.on_commit(partial(ring_prompt, prompt_id))


def default_brain() -> Brain | None:
    return Brain.objects.filter(name="default").first() or Brain.objects.first()


def check_may_prompt(user: User, saga: Saga) -> None:
    """Only managers of the saga submit prompts (checked first: a refused caller learns nothing of its body)."""
    if not may_manage(user, saga):
        raise errors.Forbidden("Only managers of the saga submit prompts.")


def is_image_url(url: object) -> bool:
    """An image a prompt carries: an http(s) URL, which the models that can see images fetch (an
    image uploaded to the saga is an artifact, referenced in the prompt's text instead)."""
    if not isinstance(url, str) or len(url) > MAX_IMAGE_URL or not url.isprintable() or " " in url:
        return False
    try:
        parts = urlsplit(url)
    except ValueError:  # a host Python's splitter refuses (`http://[::1`)
        return False
    return parts.scheme in ("http", "https") and bool(parts.netloc)


def check_images(urls: list[str], artifacts: list[str], brain: Brain, team: list[str]) -> set[str] | None:
    """A prompt's images: at most MAX_IMAGES in all (its URLs and the image artifacts it references),
    each URL an http(s) one, and roles that can see them: every forced role, or else one support role
    at least. Returns those roles (None: no image). Checked at submission, and again by routing (a
    profile may have changed meanwhile: the prompt then fails with the same reason)."""
    if len(urls) + len(artifacts) > MAX_IMAGES:
        raise errors.InvalidPayload(
            "Too many images.", errors={"images": [f"At most {MAX_IMAGES}, with the image artifacts referenced."]}
        )
    if bad := [i for i, url in enumerate(urls) if not is_image_url(url)]:
        raise errors.InvalidPayload(
            "An image is not a URL.",
            errors={"images": [f"Item {i}: an http(s) URL of at most {MAX_IMAGE_URL} characters." for i in bad]},
        )
    if not (urls or artifacts):
        return None
    seeing = vision_roles(brain.roles)
    if blind := [r for r in team if r not in seeing]:
        raise errors.InvalidPayload(
            f"The prompt carries images, which {', '.join(blind)} cannot see.",
            errors={"team": [f"Roles of {brain.name} that can see images: {sorted(seeing)}."]},
        )
    if not team and not seeing - {brain.review_role}:
        raise errors.InvalidPayload(
            "The prompt carries images, and no role of this brain can see them.",
            errors={"images": [f"No role of {brain.name} has a model that can see images."]},
        )
    return seeing


@transaction.atomic
def submit_prompt(
    *,
    saga: Saga,
    by: User,
    text: str,
    team: list[str] | None = None,
    brain: str = "",
    images: list[str] | None = None,
    idempotency_key: str = "",
) -> tuple[Prompt, bool]:
    """Start an orchestration on a prompt: its lead `agent:brain-…` joins the saga, the routing
    step is rung after commit. Managers only. Returns the prompt and whether it is new (a retry
    with the same Idempotency-Key and body returns the first one)."""
    check_may_prompt(by, saga)
    team, images = list(team or []), list(images or [])
    chosen = Brain.objects.filter(name=brain).first() if brain else default_brain()
    # Hashed by the brain it names, so that a retry naming the default brain replays one that left it out.
    digest = actions.body_hash(text=text, team=team, brain=chosen.name if chosen else brain, images=images)
    if idempotency_key and (first := first_prompt(saga, by, idempotency_key, digest)) is not None:
        return first, False
    if saga.is_finished:
        raise errors.SagaFinished(f"The saga is {saga.status}: it takes no new work.", saga_status=saga.status)
    if not text.strip():
        raise errors.InvalidPayload("An empty prompt.", errors={"prompt": ["Required."]})
    if len(text) > MAX_PROMPT_CHARS:
        raise errors.InvalidPayload("The prompt is too long.", errors={"prompt": [f"At most {MAX_PROMPT_CHARS}."]})
    # Refused here, before anything is created; the worker expands them (hooks run only there).
    image_artifacts = check_references(text=text, saga=saga, user=by)
    if chosen is None:
        raise errors.InvalidPayload(
            f"No brain {brain!r}.", errors={"brain": ["No such brain; `load_brains` adds them."]}
        )
    if unknown := [r for r in team if r not in chosen.roles]:
        raise errors.InvalidPayload(
            f"Unknown roles {', '.join(map(str, unknown))}.",
            errors={"team": [f"Roles of {chosen.name}: {sorted(chosen.roles)}."]},
        )
    if len(set(team)) != len(team) or len(team) > chosen.max_parallel_agents:
        raise errors.InvalidPayload(
            "Bad team.", errors={"team": [f"Distinct roles, at most {chosen.max_parallel_agents}."]}
        )
    check_images(images, image_artifacts, chosen, team)
    try:
        with transaction.atomic():
            prompt = Prompt.objects.create(
                saga=saga, brain=chosen, submitted_by=by, text=text, team=team, images=images,
                idempotency_key=idempotency_key, body_hash=digest,
            )  # fmt: skip
    except IntegrityError:  # the same key's first request, at the same time, committed it first
        if not idempotency_key:
            raise
        first = first_prompt(saga, by, idempotency_key, digest)
        if first is None:
            raise errors.IdempotencyConflict("This Idempotency-Key is in use by a prompt being submitted.") from None
        return first, False
    lead, _ = actions.add_agent(
        saga=saga, name=prompt.lead_name, role="Brain", task=text[:2000], runtime=Collaborator.Runtime.EXTERNAL, by=by
    )
    Prompt.objects.filter(pk=prompt.pk).update(lead=lead)
    prompt.lead = lead
    record(
        saga_id=saga.pk,
        type="prompt.submitted",
        actor=f"{by.kind}:{by.username}",
        data={"prompt_id": str(prompt.pk), "lead": lead.handle, "brain": chosen.name, "prompt": text[:2000],
              "team": team},
    )  # fmt: skip
    ring_prompt_after_commit(str(prompt.pk))
    return prompt, True


def first_prompt(saga: Saga, by: User, idempotency_key: str, digest: str) -> Prompt | None:
    """The prompt a key was first used for, if any; `idempotency_conflict` when for another body."""
    return actions.first_for_key(
        Prompt.objects.filter(saga=saga, submitted_by=by, idempotency_key=idempotency_key), digest,
        conflict="This Idempotency-Key was used for another prompt.",
    )  # fmt: skip


BRAIN_FIELDS = {f.name for f in Brain._meta.get_fields()} - {"id", "updated_at", "prompts"}


class InvalidBrains(ValueError):
    pass


@transaction.atomic
def load_brains(*, entries: Any) -> tuple[int, int]:
    """Create or update brains by name; all of them or none. Returns (created, updated). The file's
    shape is checked here; what a brain must be, by `Brain.clean`, as in the admin."""
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise InvalidBrains("A brains file holds a list of objects.")
    if (twice := repeated([entry.get("name") for entry in entries])) is not None:
        raise InvalidBrains(f"Brain {twice!r} is in the file twice.")
    created = updated = 0
    for entry in entries:
        name = entry.get("name", "?")
        if missing := {"name", "planner_profile", "roles", "default_primary"} - set(entry):
            raise InvalidBrains(f"Brain {name!r} lacks {', '.join(sorted(missing))}.")
        if unknown := set(entry) - BRAIN_FIELDS:
            raise InvalidBrains(f"Brain {name!r} has unknown keys: {', '.join(sorted(unknown))}.")
        # Checked before the model sees them: its text fields would turn a list into its repr.
        if not all(isinstance(entry.get(key, ""), str) for key in ("name", "planner_profile", "default_primary",
                                                                      "review_role")):  # fmt: skip
            raise InvalidBrains(f"Brain {name!r}: name, planner_profile, default_primary and review_role are names.")
        brain = Brain.objects.filter(name=name).first() or Brain(name=name)
        is_new = brain.pk is None
        for key, value in entry.items():
            setattr(brain, key, value)
        try:
            brain.full_clean()
        except ValidationError as exc:
            problems = "; ".join(f"{field}: {' '.join(messages)}" for field, messages in exc.message_dict.items())
            raise InvalidBrains(f"Brain {name!r}: {problems}") from exc
        brain.save()
        created, updated = created + is_new, updated + (not is_new)
    return created, updated
