"""Brains (configuration rows, like profiles) and prompts (the durable state of one orchestration).

Both belong to the `agents` app: `agents.models` imports them.
"""

import re
import uuid
from typing import Any

import regex
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models

from agents.orchestrator.plans import RESERVED_SLOTS

ROLE_RE = re.compile(r"[a-z0-9][a-z0-9_-]{0,39}")  # fullmatch: a worker is named after its role


class Brain(models.Model):
    """How prompts are routed: the planner, each role's profile, the heuristic's signals, the cap on
    parallel workers and what the review gate does with a missing or malformed review."""

    class ReviewPolicy(models.TextChoices):
        BLOCKED = "blocked", "A missing review blocks the answer"
        CHANGES_REQUESTED = "changes_requested", "A missing review asks for changes"

    name = models.SlugField(max_length=64, unique=True)
    description = models.TextField(blank=True)
    planner_profile = models.CharField(max_length=64, help_text="The router model's profile.")
    roles = models.JSONField(default=dict, help_text='Role → profile, e.g. {"coder": "brain-coder"}.')
    signals = models.JSONField(default=dict, blank=True, help_text="Role → regexes the heuristic matches.")
    default_primary = models.CharField(max_length=40, help_text="The primary when no signal matches.")
    review_role = models.CharField(max_length=40, default="review", blank=True)
    review_by_default = models.BooleanField(default=True, help_text="Whether a routed plan asks for a review.")
    max_parallel_agents = models.PositiveSmallIntegerField(default=3)
    review_policy = models.CharField(max_length=20, choices=ReviewPolicy.choices, default=ReviewPolicy.BLOCKED)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        app_label = "agents"
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        """What a brain must be for routing and delegation to work, checked when it is loaded from a
        file (`load_brains`) and when it is edited in the admin: role names a worker can be named
        after, profiles that exist, signals that compile, a default primary among the roles."""
        # Imported here: agents.models imports this module.
        from agents.models import AgentProfile

        problems: dict[str, str] = {}
        roles = self.roles
        if not isinstance(roles, dict) or not roles or not all(isinstance(p, str) for p in roles.values()):
            raise ValidationError({"roles": "Maps role names to profile names."})
        reserved = [slot for slot in RESERVED_SLOTS if slot != self.review_role]
        if bad := [r for r in roles if not isinstance(r, str) or not ROLE_RE.fullmatch(r) or r in reserved]:
            problems["roles"] = f"Bad role names {bad}: lower-case letters, digits, _ and -, not {reserved}."
        named = {*roles.values(), self.planner_profile}
        found = set(AgentProfile.objects.filter(name__in=named).values_list("name", flat=True))
        if self.planner_profile not in found:
            problems["planner_profile"] = f"No profile {self.planner_profile!r}."
        if missing := sorted(set(roles.values()) - found):
            problems.setdefault("roles", f"No profiles {missing}.")
        if self.default_primary not in roles:
            problems["default_primary"] = "Not one of the roles."
        if signal_problem := self.signal_problem():
            problems["signals"] = signal_problem
        if problems:
            raise ValidationError(problems)

    def signal_problem(self) -> str:
        """Why the signals would not route (a pattern that does not compile raises `regex.error` in
        the heuristic), or ""."""
        if not isinstance(self.signals, dict):
            return "Maps role names to lists of patterns."
        for role, patterns in self.signals.items():
            if role not in self.roles or not isinstance(patterns, list):
                return f"The signals of {role!r} must be a list, for one of the roles."
            for pattern in patterns:
                try:
                    regex.compile(pattern)
                except (regex.error, TypeError) as exc:
                    return f"Bad pattern {pattern!r}: {exc}"
        return ""


class Prompt(models.Model):
    """One orchestration. `step` moves forward only, by compare-and-set, so that any number of
    doorbells (a finished worker, the periodic resume, a restarted worker) advance it exactly once."""

    class Status(models.TextChoices):
        RUNNING = "running"
        COMPLETED = "completed"
        FAILED = "failed"
        BLOCKED = "blocked"

    class Step(models.TextChoices):
        ROUTING = "routing"
        WORKERS = "workers"
        PRIMARY = "primary"
        REVIEW = "review"
        DONE = "done"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    saga = models.ForeignKey("sagas.Saga", on_delete=models.CASCADE, related_name="prompts")
    brain = models.ForeignKey(Brain, on_delete=models.PROTECT, related_name="prompts")
    lead = models.OneToOneField(
        "sagas.Collaborator", on_delete=models.SET_NULL, null=True, blank=True, related_name="led_prompt"
    )
    submitted_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    text = models.TextField()
    expanded = models.TextField(
        blank=True, help_text="The prompt as the router and workers get it: references expanded, hook context added."
    )
    images = models.JSONField(default=list, blank=True, help_text="Image references; only vision roles get them.")
    team = models.JSONField(default=list, blank=True, help_text="Forced roles: no router, no review.")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.RUNNING)
    step = models.CharField(max_length=16, choices=Step.choices, default=Step.ROUTING)
    plan = models.JSONField(null=True, blank=True)
    step_until = models.DateTimeField(
        null=True,
        blank=True,
        help_text="Who runs the step's slow part (the router, hooks) holds this lease: a doorbell meanwhile "
        "does not run it again.",
    )
    results = models.JSONField(default=list, blank=True, help_text="Each support worker's WorkerResult.")
    mcp = models.JSONField(
        default=dict, blank=True, help_text="The primary's MCP servers, connected before it ran: tools or why not."
    )
    answer = models.TextField(blank=True, help_text="The primary's answer (or the team's, side by side).")
    review = models.JSONField(null=True, blank=True)
    final_answer = models.TextField(blank=True, help_text="The answer with the review merged in.")
    reason = models.TextField(blank=True, help_text="Why it failed or was blocked.")
    idempotency_key = models.CharField(max_length=200, blank=True)
    body_hash = models.CharField(max_length=64, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    # Not a column: the lifecycle events its brain has handlers for, when this copy was read with
    # them (an orchestration step's: reads.read_prompts); None when not.
    hooked_events: frozenset[str] | None = None
    # Not a column: the step's lease (step_until) this copy took, while it holds it (hooking.claim_step).
    held_until: Any = None
    # Not a column: the runs of its lead's workers (each with its collaborator), when this copy was
    # read with them (reads.prompts_ahead); None when not.
    runs_read: list[list[Any]] | None = None
    # Not a column: its primary role's agent profile by name (none: no such profile), when this copy
    # was read with it (reads.prompts_ahead, on PostgreSQL); None when not.
    profiles_read: dict[str, Any] | None = None

    class Meta:
        app_label = "agents"
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["saga", "submitted_by", "idempotency_key"],
                condition=~models.Q(idempotency_key=""),
                name="prompt_idempotency_key_unique",
            ),
        ]
        indexes = [models.Index(fields=["status", "updated_at"], name="prompt_status_updated")]

    def __str__(self) -> str:
        return f"{self.pk} {self.status}"

    @property
    def short(self) -> str:
        return self.pk.hex[:10]

    @property
    def lead_name(self) -> str:
        return f"{LEAD_PREFIX}{self.short}"

    @property
    def is_team(self) -> bool:
        return bool(self.team)

    def worker_name(self, slot: str) -> str:
        """The delegate's name for a slot (a support role, `primary` or `review`): derived from the
        prompt, so that a step run twice finds the delegate it already created."""
        return f"{self.lead_name}.{slot}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "prompt_id": str(self.pk),
            "saga": str(self.saga_id),
            "brain": self.brain.name,
            "lead": f"agent:{self.lead_name}",
            "status": self.status,
            "step": self.step,
            "prompt": self.text,
            "expanded": self.expanded,
            "team": self.team,
            "plan": self.plan,
            "results": self.results,
            "mcp": self.mcp,
            "answer": self.answer,
            "review": self.review,
            "final_answer": self.final_answer,
            "reason": self.reason,
            "created_at": self.created_at.isoformat(),
            "updated_at": self.updated_at.isoformat(),
        }


LEAD_PREFIX = "brain-"


def is_brain_worker(name: str) -> bool:
    """Whether a collaborator's name is that of a prompt's worker (`brain-….role`, or its delegate)."""
    return name.startswith(LEAD_PREFIX) and "." in name


def lead_of(name: str) -> str:
    """The prompt's lead of a worker named so."""
    return name.split(".", 1)[0]
