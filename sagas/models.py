import uuid

from django.conf import settings
from django.db import models
from guardian.shortcuts import get_objects_for_user

from accounts.models import User


class SagaQuerySet(models.QuerySet["Saga"]):
    def visible_to(self, user: User) -> "SagaQuerySet":
        """The sagas user may see: owned, or granted `view_saga` when they joined."""
        if not user.is_authenticated or not user.is_active:
            return self.none()
        if user.is_superuser:
            return self.all()
        granted = get_objects_for_user(user, "sagas.view_saga", klass=Saga, accept_global_perms=False)
        return self.filter(models.Q(owner=user) | models.Q(pk__in=granted.values("pk")))


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
    created_at = models.DateTimeField(auto_now_add=True)

    objects = SagaQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        permissions = [("manage_saga", "Manage the saga: add collaborators, steer, prompt")]

    def __str__(self) -> str:
        return self.title

    @property
    def is_finished(self) -> bool:
        return self.status != self.Status.OPEN
