import uuid
from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import Q
from guardian.shortcuts import get_objects_for_user


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:20]}"


def new_run_id() -> str:
    return new_id("run")


def new_request_id() -> str:
    return new_id("req")


def new_broadcast_id() -> str:
    return new_id("bc")


def new_human_request_id() -> str:
    return new_id("hreq")


class SagaQuerySet(models.QuerySet["Saga"]):
    def visible_to(self, user: Any) -> "SagaQuerySet":
        """The sagas user may see: owned, or granted `view_saga` when they joined."""
        if not user.is_authenticated or not user.is_active:
            return self.none()
        if user.is_superuser:
            return self.all()
        granted = get_objects_for_user(user, "sagas.view_saga", klass=Saga, accept_global_perms=False)
        return self.filter(Q(owner=user) | Q(pk__in=granted.values("pk")))


class Saga(models.Model):
    """A durable unit of collaborative work."""

    class Status(models.TextChoices):
        OPEN = "open"
        COMPLETED = "completed"
        CANCELLED = "cancelled"

    class Policy(models.TextChoices):
        HUB = "hub", "hub: agents address only their delegator"
        TREE = "tree", "tree: delegator, delegates and siblings"
        OPEN = "open", "open: every visible agent"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    title = models.CharField(max_length=200)
    goal = models.TextField(blank=True)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="owned_sagas")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.OPEN)
    policy = models.CharField(max_length=8, choices=Policy.choices, default=Policy.TREE)
    idempotency_key = models.CharField(max_length=200, blank=True, help_text="Its creator's, for a retried create.")
    body_hash = models.CharField(max_length=64, blank=True, help_text="What the idempotency key was first used for.")
    created_at = models.DateTimeField(auto_now_add=True)

    objects = SagaQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        permissions = [("manage_saga", "Manage the saga: add collaborators, steer, prompt")]
        constraints = [
            models.UniqueConstraint(
                fields=["owner", "idempotency_key"], condition=~Q(idempotency_key=""), name="saga_idempotency_unique"
            ),
        ]

    def __str__(self) -> str:
        return self.title

    @property
    def is_finished(self) -> bool:
        return self.status != self.Status.OPEN


class Collaborator(models.Model):
    """A participant of one saga, agent or human, with a stable id such as `agent:coder-01`."""

    class Kind(models.TextChoices):
        AGENT = "agent"
        HUMAN = "human"

    class Runtime(models.TextChoices):
        INTERNAL = "internal", "internal: Agora runs its turns"
        EXTERNAL = "external", "external: it runs elsewhere and speaks REST"
        NONE = "", "none (a person)"

    saga = models.ForeignKey(Saga, on_delete=models.CASCADE, related_name="collaborators")
    kind = models.CharField(max_length=8, choices=Kind.choices)
    name = models.CharField(max_length=64)
    role = models.CharField(max_length=120, blank=True)
    task = models.TextField(blank=True)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="collaborations")
    runtime = models.CharField(max_length=8, choices=Runtime.choices, blank=True, default=Runtime.NONE)
    profile = models.CharField(max_length=64, blank=True, help_text="Agent profile name, for internal agents.")
    steering_seq = models.PositiveBigIntegerField(default=0, help_text="The last seq given to its steering.")
    exposed = models.BooleanField(
        default=False, help_text="Reachable by A2A clients through the gateway, with an agent card (set by a manager)."
    )
    joined_at = models.DateTimeField(auto_now_add=True)
    # Who added it and with which Idempotency-Key (payloads.caller_key), and the body it was for.
    idempotency_key = models.CharField(max_length=64, blank=True, default="", db_default="")
    body_hash = models.CharField(max_length=64, blank=True, default="", db_default="")

    class Meta:
        ordering = ["saga", "joined_at", "pk"]
        permissions = [("address_collaborator", "Address requests to this collaborator")]
        constraints = [
            models.UniqueConstraint(fields=["saga", "kind", "name"], name="collaborator_handle_unique"),
            models.UniqueConstraint(fields=["saga", "user"], name="collaborator_principal_unique"),
            models.UniqueConstraint(
                fields=["saga", "idempotency_key"],
                condition=~Q(idempotency_key=""),
                name="collaborator_idempotency_unique",
            ),
            models.CheckConstraint(
                condition=(Q(kind="agent") & ~Q(runtime="")) | (Q(kind="human") & Q(runtime="")),
                name="collaborator_runtime_matches_kind",
            ),
        ]

    def __str__(self) -> str:
        return self.handle

    @property
    def handle(self) -> str:
        return f"{self.kind}:{self.name}"

    @property
    def is_agent(self) -> bool:
        return self.kind == self.Kind.AGENT


class Delegation(models.Model):
    """An edge of the saga's tree: the delegator handed `task` to the delegate."""

    class Status(models.TextChoices):
        ACTIVE = "active"
        COMPLETED = "completed"
        FAILED = "failed"
        CANCELLED = "cancelled"

    saga = models.ForeignKey(Saga, on_delete=models.CASCADE, related_name="delegations")
    delegator = models.ForeignKey(Collaborator, on_delete=models.CASCADE, related_name="delegations_made")
    delegate = models.OneToOneField(Collaborator, on_delete=models.CASCADE, related_name="delegation")
    task = models.TextField(blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.ACTIVE)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.CheckConstraint(condition=~Q(delegator=models.F("delegate")), name="delegation_not_self")]

    def __str__(self) -> str:
        return f"{self.delegator} → {self.delegate}"


class Run(models.Model):
    """One agent collaborator's execution: the state machine of DESIGN.md §5."""

    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        IDLE = "idle"
        WAITING = "waiting"
        COMPLETED = "completed"
        FAILED = "failed"
        CANCELLED = "cancelled"
        SHUTDOWN = "shutdown"

    FINISHED = (Status.COMPLETED, Status.FAILED, Status.CANCELLED, Status.SHUTDOWN)

    id = models.CharField(primary_key=True, max_length=32, default=new_run_id, editable=False)
    collaborator = models.OneToOneField(Collaborator, on_delete=models.CASCADE, related_name="run")
    team = models.ForeignKey(
        "Team", null=True, blank=True, on_delete=models.SET_NULL, related_name="runs",
        help_text="Set for a persistent teammate: it idles between tasks instead of finishing.",
    )  # fmt: skip
    spawn_key = models.CharField(max_length=200, blank=True, help_text="The Idempotency-Key of a teammate's spawn.")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    turn = models.PositiveIntegerField(default=0, help_text="Turns started so far.")
    reclaims = models.PositiveIntegerField(
        default=0, db_default=0,  # the database's too: rows a worker of the release before inserts
        help_text="Turns taken back after their worker died (made again by the next): not counted as turns used.",
    )  # fmt: skip
    # Reclaims one after another (each remake is the next turn) are a turn that fails each time it is made.
    reclaimed_turn = models.PositiveIntegerField(default=0, db_default=0, help_text="The turn last taken back.")
    reclaims_in_row = models.PositiveIntegerField(
        default=0, db_default=0,
        help_text="Turns taken back one after another, none ended between: past AGORA_MAX_RECLAIMS the run fails.",
    )  # fmt: skip
    lease_until = models.DateTimeField(null=True, blank=True)
    # Who ran it last, for operators: kept after the turn ends and after a reclaim, which names it.
    worker = models.CharField(
        max_length=255, blank=True, help_text="Node name of the Celery worker that took its latest turn."
    )
    resumable = models.BooleanField(default=False)
    waiting_on = models.ForeignKey("AgentRequest", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    waiting_on_remote = models.ForeignKey(
        "RemoteCall", null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
        help_text="The ask_remote_agent call (mode=wait) the run is parked on.",
    )  # fmt: skip
    wait_until = models.DateTimeField(null=True, blank=True)
    wait_tool_call_id = models.CharField(max_length=120, blank=True)
    result = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        indexes = [models.Index(fields=["status", "lease_until"]), models.Index(fields=["status", "wait_until"])]
        constraints = [
            models.CheckConstraint(
                condition=~Q(status="waiting") | Q(wait_until__isnull=False), name="run_waiting_has_deadline"
            ),
            models.UniqueConstraint(
                fields=["team", "spawn_key"], condition=~Q(spawn_key=""), name="run_spawn_idempotency_unique"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.pk} ({self.status})"

    @property
    def is_finished(self) -> bool:
        return self.status in self.FINISHED

    @property
    def team_status(self) -> str:
        """What a team's roster says of its run: working, idle, waiting or shutdown."""
        return TEAM_STATUS.get(self.status, "shutdown")


TEAM_STATUS: dict[str, str] = {
    Run.Status.QUEUED: "working",
    Run.Status.RUNNING: "working",
    Run.Status.IDLE: "idle",
    Run.Status.WAITING: "waiting",
}


class Team(models.Model):
    """A lead agent's persistent teammates (its delegates spawned as a team), with their budgets."""

    saga = models.ForeignKey(Saga, on_delete=models.CASCADE, related_name="teams")
    lead = models.OneToOneField(Collaborator, on_delete=models.CASCADE, related_name="team")
    max_teammates = models.PositiveIntegerField(help_text="Teammates at work at once (shut down ones do not count).")
    max_tokens = models.PositiveBigIntegerField(help_text="Tokens all teammates together may use.")
    idle_timeout_s = models.FloatField(help_text="A teammate idle longer than this is shut down; 0: never.")
    tokens_used = models.PositiveBigIntegerField(
        default=0, help_text="Tokens its teammates' model calls used, counted by the turns that stored them."
    )
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"team of {self.lead}"


class Broadcast(models.Model):
    """One broadcast of a team's lead: one steering item per teammate active at that instant."""

    id = models.CharField(primary_key=True, max_length=32, default=new_broadcast_id, editable=False)
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="broadcasts")
    sender = models.CharField(max_length=160, help_text="The engine-written sender id.")
    content = models.JSONField()
    recipients = models.JSONField(default=list, help_text="The teammates' ids it was written to.")
    idempotency_key = models.CharField(max_length=200, blank=True)
    body_hash = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["team", "sender", "idempotency_key"],
                condition=~Q(idempotency_key=""),
                name="broadcast_idempotency_unique",
            )
        ]

    def __str__(self) -> str:
        return self.pk


class AgentRequest(models.Model):
    """One `ask_agent` request, durable from creation to its single terminal state."""

    class Mode(models.TextChoices):
        ASYNC = "async"
        WAIT = "wait"

    class Status(models.TextChoices):
        PENDING = "pending"
        DELIVERED = "delivered"
        COMPLETED = "completed"
        FAILED = "failed"
        CANCELLED = "cancelled"
        EXPIRED = "expired"
        RECIPIENT_UNAVAILABLE = "recipient_unavailable"

    OPEN = (Status.PENDING, Status.DELIVERED)

    id = models.CharField(primary_key=True, max_length=32, default=new_request_id, editable=False)
    saga = models.ForeignKey(Saga, on_delete=models.CASCADE, related_name="requests")
    # Indexed with their status (Meta.indexes), which serves every lookup by either alone too.
    sender = models.ForeignKey(Collaborator, on_delete=models.CASCADE, related_name="requests_sent", db_index=False)
    recipient = models.ForeignKey(
        Collaborator, on_delete=models.CASCADE, related_name="requests_received", db_index=False
    )
    type = models.CharField(max_length=100)
    payload = models.JSONField()
    mode = models.CharField(max_length=8, choices=Mode.choices, default=Mode.ASYNC)
    status = models.CharField(max_length=24, choices=Status.choices, default=Status.PENDING)
    reply = models.JSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True, help_text='{"code", "message"} for failed and terminal errors')
    idempotency_key = models.CharField(max_length=200, blank=True)
    body_hash = models.CharField(max_length=64, help_text="What the idempotency key was first used for.")
    hop = models.PositiveSmallIntegerField(default=1)
    wait_deadline = models.DateTimeField(
        null=True, blank=True, help_text="Set while the sender waits on this request: an edge of the waits-for graph."
    )
    expires_at = models.DateTimeField()
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["sender", "idempotency_key"],
                condition=~Q(idempotency_key=""),
                name="request_idempotency_unique",
            ),
            models.CheckConstraint(condition=~Q(sender=models.F("recipient")), name="request_not_to_self"),
            models.CheckConstraint(
                condition=~Q(status="completed") | Q(reply__isnull=False), name="request_completed_has_reply"
            ),
        ]
        indexes = [
            models.Index(fields=["status", "expires_at"]),
            models.Index(fields=["saga", "status"]),
            models.Index(fields=["wait_deadline"]),
            # A collaborator's open requests, sent and received, counted by every ask and read when
            # its run ends: found among its open ones, not among all it ever sent or received.
            models.Index(fields=["sender", "status"]),
            models.Index(fields=["recipient", "status"]),
        ]

    def __str__(self) -> str:
        return self.pk

    @property
    def is_open(self) -> bool:
        return self.status in self.OPEN


class HumanRequest(models.Model):
    """One `ask_human` form addressed to a person; a mechanism of its own, separate from ask_agent."""

    class Status(models.TextChoices):
        PENDING = "pending"
        ANSWERED = "answered"
        CANCELLED = "cancelled"

    id = models.CharField(primary_key=True, max_length=32, default=new_human_request_id, editable=False)
    saga = models.ForeignKey(Saga, on_delete=models.CASCADE, related_name="human_requests")
    asker = models.ForeignKey(Collaborator, on_delete=models.CASCADE, related_name="human_requests_sent")
    addressee = models.ForeignKey(Collaborator, on_delete=models.CASCADE, related_name="human_requests_received")
    title = models.CharField(max_length=200)
    fields = models.JSONField(help_text="[{name, label, type, required, choices}]")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    answer = models.JSONField(null=True, blank=True)
    answered_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    idempotency_key = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    answered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["asker", "idempotency_key"],
                condition=~Q(idempotency_key=""),
                name="human_request_idempotency_unique",
            ),
            models.CheckConstraint(
                condition=~Q(status="answered") | Q(answer__isnull=False, answered_by__isnull=False),
                name="human_request_answered_has_answer",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.pk}: {self.title}"


class SteeringItem(models.Model):
    """One item in a collaborator's durable inbound queue, numbered per recipient.

    Drained only at turn boundaries; `consumed_turn` is set in the transaction that records the turn
    that saw it (or, for external agents, when they acknowledge it with the feed's cursor).
    """

    class Kind(models.TextChoices):
        REQUEST = "request"
        RESPONSE = "response"
        HUMAN_RESPONSE = "human_response"
        MESSAGE = "message"
        NOTICE = "notice"

    recipient = models.ForeignKey(Collaborator, on_delete=models.CASCADE, related_name="steering")
    seq = models.PositiveBigIntegerField()
    kind = models.CharField(max_length=16, choices=Kind.choices)
    sender = models.CharField(max_length=160, help_text="The engine-written sender id, such as agent:coder-01.")
    request = models.ForeignKey(AgentRequest, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    human_request = models.ForeignKey(HumanRequest, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    broadcast = models.ForeignKey(Broadcast, null=True, blank=True, on_delete=models.CASCADE, related_name="items")
    payload = models.JSONField(null=True, blank=True)
    consumed_turn = models.PositiveIntegerField(null=True, blank=True)
    consumed_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # A manager's message only (`steer`): its sender's Idempotency-Key, and what it was first used for.
    idempotency_key = models.CharField(max_length=200, blank=True, default="", db_default="")
    body_hash = models.CharField(max_length=64, blank=True, default="", db_default="")

    class Meta:
        ordering = ["recipient", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["recipient", "seq"], name="steering_recipient_seq_unique"),
            models.UniqueConstraint(
                fields=["recipient", "sender", "idempotency_key"],
                condition=~Q(idempotency_key=""),
                name="steering_idempotency_unique",
            ),
            models.UniqueConstraint(
                fields=["recipient", "request", "kind"],
                condition=Q(request__isnull=False),
                name="steering_one_per_request_kind",
            ),
            models.UniqueConstraint(
                fields=["recipient", "broadcast"],
                condition=Q(broadcast__isnull=False),
                name="steering_one_per_broadcast",
            ),
            models.UniqueConstraint(
                fields=["recipient", "human_request", "kind"],
                condition=Q(human_request__isnull=False),
                name="steering_one_per_human_request_kind",
            ),
        ]
        indexes = [models.Index(fields=["recipient", "consumed_at", "seq"])]

    def __str__(self) -> str:
        return f"{self.recipient} #{self.seq} {self.kind}"


# A saga's artifacts, the remote A2A agents it allows and the calls made to them live in their own
# modules.
from sagas.artifact_models import ARTIFACT_NAME, TEXT_TYPES, Artifact  # noqa: E402, F401
from sagas.remotes import RemoteAgent, RemoteCall  # noqa: E402, F401
