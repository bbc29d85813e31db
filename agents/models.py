from collections.abc import Callable
from typing import Any

from django.core.exceptions import ValidationError
from django.db import connection, models

# Hook handlers and their stored results live in the hooks package; Django finds them through this module.
from agents.hooks.models import HookHandler, HookResult  # noqa: F401
from config.sql import columns, fetch_one, placeholders, prepared


def text(value: Any) -> bool:
    return isinstance(value, str)


def names(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# What each key of a profile holds, checked before the model sees it (a text field would store a
# list as its repr, a list field would take a string as its letters).
PROFILE_TYPES: dict[str, Callable[[Any], bool]] = {
    "name": text, "role": text, "system_prompt": text, "model": text, "endpoint": text,
    "tools": names, "fallback_models": names, "requires": names, "mcp_servers": names,
    "model_capabilities": lambda value: isinstance(value, dict) and all(names(v) for v in value.values()),
    "resumable": lambda value: isinstance(value, bool),
    "max_turns": whole, "max_tokens": whole,
}  # fmt: skip
WRONG_TYPE = (
    "names and model ids are text; tools, fallback_models, requires and mcp_servers lists of them; "
    "model_capabilities maps a model to a list"
)


class AgentProfile(models.Model):
    """A role definition: what the agent is told, which tools it may call, which models it runs on."""

    name = models.SlugField(max_length=64, unique=True)
    role = models.CharField(max_length=120)
    system_prompt = models.TextField(blank=True)
    tools = models.JSONField(default=list, help_text="Names of the tools the agent may call.")
    model = models.CharField(max_length=120, help_text="Model id; `scripted:<playbook>` for the offline provider.")
    fallback_models = models.JSONField(default=list, blank=True, help_text="Ordered, explicit fallback model ids.")
    endpoint = models.CharField(max_length=64, default="default", help_text="Named OpenAI-compatible endpoint.")
    requires = models.JSONField(default=list, blank=True, help_text='Capabilities a model must have, e.g. ["vision"].')
    model_capabilities = models.JSONField(
        default=dict, blank=True, help_text='What each model can do, e.g. {"gpt-4.1-mini": ["vision"]}.'
    )
    resumable = models.BooleanField(default=False, help_text="Whether a finished run restarts on a new request.")
    max_turns = models.PositiveIntegerField(default=40)
    max_tokens = models.PositiveIntegerField(default=200_000, help_text="Token budget for one run.")
    mcp_servers = models.JSONField(
        default=list, blank=True, help_text="Names of the MCP servers whose allowed tools the agent gets."
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def candidates(self) -> list[str]:
        return [self.model, *self.fallback_models]

    def clean(self) -> None:
        """The types `load_profiles` checks, for whatever else saves a profile (the admin's form): a
        list field given text or a map given a list would be read wrongly by every turn, or fail it."""
        if wrong := {name: [WRONG_TYPE] for name, fits in PROFILE_TYPES.items() if not fits(getattr(self, name))}:
            raise ValidationError(wrong)

    def lacks(self, model: str, *, also: list[str] | None = None) -> list[str]:
        """The capabilities `model` lacks of those this profile requires, and of `also` (what
        this call needs besides: `vision` for a prompt that carries images)."""
        has = self.model_capabilities.get(model, [])
        return [c for c in dict.fromkeys([*self.requires, *(also or [])]) if c not in has]


def missing_profiles(names: set[str]) -> set[str]:
    """The kernel's question before it adds internal agents (`AGORA_MISSING_PROFILES`): which of
    these profiles do not exist."""
    if not names:
        return set()
    with connection.cursor() as cursor:
        cursor.execute(prepared(_PROFILE_NAMES_SQL.format(ids=placeholders(len(names)))), list(names))
        return names - {name for (name,) in cursor.fetchall()}


_PROFILE_NAMES_SQL = f"SELECT name FROM {AgentProfile._meta.db_table} WHERE name IN ({{ids}})"


def profile_named(name: str) -> AgentProfile | None:
    """One profile by name, with a written-out statement: the routing step reads its planner's,
    the collecting step its primary's."""
    row = fetch_one(_PROFILE_SQL, [name], AgentProfile)
    return row[0] if row else None


_PROFILE_SQL = prepared(f"SELECT {columns(AgentProfile, 'p')} FROM {AgentProfile._meta.db_table} p WHERE p.name = %s")


def tokens_used(run_ids: list[str]) -> dict[str, int]:
    """The kernel's question for a team's roster and budget (`AGORA_RUN_TOKENS`): tokens by run."""
    rows = TranscriptEntry.objects.filter(run_id__in=run_ids).values("run_id").annotate(total=models.Sum("tokens"))
    return {row["run_id"]: int(row["total"] or 0) for row in rows}


class TranscriptEntry(models.Model):
    """One message of a run's conversation, in the chat-completions shape, so any run can resume
    after a crash from exactly what was persisted."""

    run = models.ForeignKey("sagas.Run", on_delete=models.CASCADE, related_name="transcript")
    seq = models.PositiveIntegerField()
    turn = models.PositiveIntegerField()
    message = models.JSONField()
    tokens = models.PositiveIntegerField(default=0, help_text="Tokens the model call that wrote it used.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["run", "seq"], name="transcript_run_seq_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.run_id} #{self.seq} {self.message.get('role')}"


# The MCP servers' and the orchestrator's rows live in their own modules; Django finds them here.
from agents.mcp.models import McpServer  # noqa: E402
from agents.orchestrator.models import Brain, Prompt  # noqa: E402

__all__ = [
    "PROFILE_TYPES",
    "WRONG_TYPE",
    "AgentProfile",
    "Brain",
    "McpServer",
    "Prompt",
    "TranscriptEntry",
    "missing_profiles",
    "tokens_used",
]
