"""Remote A2A agents a saga's agents may call (`ask_remote_agent`), and each call made to one.

A manager allows an endpoint per saga; an agent names it, and nothing else is ever called. A call
is durable like a request between agents: it is written with its journal event before anything is
sent, a Celery task takes it from there (send, then follow the remote task until it ends), and it
ends once, in one compare-and-set, with its reply or its error.
"""

import uuid

from django.db import models
from django.db.models import Q


def new_remote_call_id() -> str:
    return f"rc-{uuid.uuid4().hex[:20]}"


class RemoteAgent(models.Model):
    """One remote A2A agent a saga's agents may call, by name or by this exact URL.

    No credential is stored: `token_env` names a variable of the workers' environment that holds
    the bearer token sent with every call (as MCP servers' headers take theirs).
    """

    saga = models.ForeignKey("sagas.Saga", on_delete=models.CASCADE, related_name="remote_agents")
    name = models.CharField(max_length=64, help_text="What agents call it by.")
    url = models.URLField(max_length=2000, help_text="The agent's A2A URL (its card is under it).")
    token_env = models.CharField(
        max_length=100, blank=True, help_text="The workers' environment variable holding its bearer token."
    )
    added_by = models.CharField(max_length=160, help_text="The manager who allowed it, such as human:alice.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["saga", "name"]
        constraints = [
            models.UniqueConstraint(fields=["saga", "name"], name="remote_agent_saga_name_unique"),
            models.UniqueConstraint(fields=["saga", "url"], name="remote_agent_saga_url_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.name} → {self.url}"


class RemoteCall(models.Model):
    """One `ask_remote_agent` call: pending (not sent yet) → working (the remote task's id is
    known) → completed (its reply) or failed (its error); terminal once, by compare-and-set."""

    class Mode(models.TextChoices):
        ASYNC = "async"
        WAIT = "wait"

    class Status(models.TextChoices):
        PENDING = "pending"
        WORKING = "working"
        COMPLETED = "completed"
        FAILED = "failed"

    OPEN = (Status.PENDING, Status.WORKING)

    id = models.CharField(primary_key=True, max_length=32, default=new_remote_call_id, editable=False)
    saga = models.ForeignKey("sagas.Saga", on_delete=models.CASCADE, related_name="remote_calls")
    caller = models.ForeignKey("sagas.Collaborator", on_delete=models.CASCADE, related_name="remote_calls")
    # Removing the endpoint revokes it: a call still open finds it gone and fails.
    remote_agent = models.ForeignKey(
        RemoteAgent, null=True, blank=True, on_delete=models.SET_NULL, related_name="calls"
    )
    agent_name = models.CharField(max_length=64)
    url = models.URLField(max_length=2000)
    message = models.JSONField(help_text="What was sent: a string is a text part, anything else a data part.")
    mode = models.CharField(max_length=8, choices=Mode.choices, default=Mode.ASYNC)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    task_id = models.CharField(max_length=200, blank=True, help_text="The remote A2A task's id.")
    context_id = models.CharField(max_length=200, blank=True)
    reply = models.JSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True, help_text='{"code", "message"} of a failed call')
    idempotency_key = models.CharField(max_length=200, blank=True)
    deadline = models.DateTimeField(help_text="The remote task must have ended by then, or the call fails.")
    # The follower task's bookkeeping: each step is claimed by compare-and-set on `step`, so a
    # duplicated doorbell does nothing; `lease_until` is held while one runs, `next_step_at` says
    # when the next is due (the reconciler re-rings one that should have run and did not).
    step = models.PositiveIntegerField(default=0)
    lease_until = models.DateTimeField(null=True, blank=True)
    next_step_at = models.DateTimeField()
    failures = models.PositiveSmallIntegerField(default=0, help_text="Transport failures in a row.")
    attempts = models.PositiveIntegerField(default=0, help_text="Calls made to the remote agent.")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["caller", "idempotency_key"],
                condition=~Q(idempotency_key=""),
                name="remote_call_idempotency_unique",
            ),
            models.CheckConstraint(
                condition=~Q(status="completed") | Q(reply__isnull=False), name="remote_call_completed_has_reply"
            ),
            models.CheckConstraint(
                condition=~Q(status="failed") | Q(error__isnull=False), name="remote_call_failed_has_error"
            ),
        ]
        indexes = [models.Index(fields=["status", "next_step_at"])]

    def __str__(self) -> str:
        return self.pk

    @property
    def is_open(self) -> bool:
        return self.status in self.OPEN
