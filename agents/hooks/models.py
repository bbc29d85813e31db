"""Hook handlers (configuration rows, loaded from a file) and their stored results (what makes a
retried hook run return the first outcome instead of running a finished handler again)."""

from django.db import models
from django.db.models import Q

from agents.hooks.events import Event
from config.sql import columns, fetch, prepared


class HookHandler(models.Model):
    """One trusted handler of one lifecycle event, global (`brain` blank) or for one brain."""

    class Type(models.TextChoices):
        COMMAND = "command", "command: an argv list, run without a shell, the event JSON on stdin"
        WEBHOOK = "webhook", "webhook: the event JSON POSTed to a URL"
        PYTHON = "python", "python: a dotted path called with the event"

    EVENTS = [(e.value, e.value) for e in Event]

    name = models.SlugField(max_length=64)
    brain = models.CharField(max_length=64, blank=True, help_text="The brain it belongs to; blank for every brain.")
    event = models.CharField(max_length=32, choices=EVENTS)
    matcher = models.CharField(
        max_length=200, blank=True, help_text="A role name or a regex over it; blank matches every role."
    )
    type = models.CharField(max_length=8, choices=Type.choices)
    argv = models.JSONField(default=list, blank=True)
    url = models.URLField(max_length=500, blank=True)
    callable = models.CharField(max_length=200, blank=True, help_text="Dotted path, e.g. `myhooks.policy.check`.")
    timeout_s = models.FloatField(default=10.0)
    trusted = models.BooleanField(default=False)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["event", "brain", "name"]
        constraints = [
            models.UniqueConstraint(fields=["brain", "name"], name="hook_handler_brain_name_unique"),
            # Loading refuses untrusted handlers; the table says so too, whatever writes to it.
            models.CheckConstraint(condition=Q(trusted=True), name="hook_handler_trusted"),
            models.CheckConstraint(condition=Q(timeout_s__gt=0), name="hook_handler_timeout_positive"),
        ]

    def __str__(self) -> str:
        return self.label

    @property
    def label(self) -> str:
        return f"{self.brain}/{self.name}" if self.brain else self.name


class HookResult(models.Model):
    """What one handler returned for one hook run (`key`), stored as soon as it finished."""

    class Status(models.TextChoices):
        OK = "ok", "ok: no decision, maybe context"
        BLOCKED = "blocked"
        IGNORED = "ignored", "ignored: output this event does not take"
        ERROR = "error", "error: non-zero exit, crash or unparsable output"
        TIMED_OUT = "timed_out"

    saga = models.ForeignKey("sagas.Saga", on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=300, help_text="The caller's name for this hook run: prompt, event, worker.")
    event = models.CharField(max_length=32, choices=HookHandler.EVENTS)
    handler = models.CharField(max_length=130, help_text="The handler's label: `name`, or `brain/name`.")
    status = models.CharField(max_length=12, choices=Status.choices)
    reason = models.TextField(blank=True, help_text="The block reason.")
    context = models.TextField(blank=True, help_text="The context it added.")
    error = models.TextField(blank=True)
    duration_ms = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["saga", "key", "handler"]
        constraints = [
            models.UniqueConstraint(fields=["saga", "key", "handler"], name="hook_result_once_per_handler"),
        ]

    def __str__(self) -> str:
        return f"{self.key} {self.handler}: {self.status}"


def handlers_for(event: Event | str, *, brain: str = "") -> list[HookHandler]:
    """The trusted handlers of one event: the global ones and, when given, the brain's own, in the
    order they run. Every step of an orchestration asks, most often to find none: one plain
    statement."""
    return [handler for (handler,) in fetch(_FOR_EVENT_SQL, [str(event), True, brain], HookHandler)]


def handled_sql(event: Event | str, *, brain: str) -> str:
    """An SQL expression for a statement that reads it with the rest it reads: whether `event` has
    a trusted handler (as handlers_for() finds them) for the brain whose name is the column `brain`."""
    return (
        f"EXISTS (SELECT 1 FROM {HookHandler._meta.db_table} h WHERE h.event = '{Event(event).value}' "
        f"AND h.trusted = TRUE AND (h.brain = '' OR h.brain = {brain}))"
    )


_FOR_EVENT_SQL = prepared(
    f"SELECT {columns(HookHandler, 'h')} FROM {HookHandler._meta.db_table} h "
    "WHERE h.event = %s AND h.trusted = %s AND (h.brain = '' OR h.brain = %s) ORDER BY h.brain, h.name"
)
