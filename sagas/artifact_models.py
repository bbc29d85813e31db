"""A saga's artifacts: named texts and files, kept in the database (sagas.models imports them)."""

from typing import TYPE_CHECKING

from django.db import models

if TYPE_CHECKING:
    from sagas.models import Saga

ARTIFACT_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,98}[A-Za-z0-9_-])?"
# Text artifacts are shown to models as text; the others are files (images go to vision models).
TEXT_TYPES = ("application/json", "application/xml", "application/yaml", "application/x-yaml")


class ArtifactQuerySet(models.QuerySet["Artifact"]):
    def listing(self, saga: "Saga") -> "ArtifactQuerySet":
        """A saga's artifacts without their content, by name."""
        return self.filter(saga=saga).defer("content").order_by("name")


class Artifact(models.Model):
    """A named text or file of one saga, readable by whoever may see the saga. Kept in the database,
    the source of truth that every worker machine reaches."""

    saga = models.ForeignKey("sagas.Saga", on_delete=models.CASCADE, related_name="artifacts")
    name = models.CharField(max_length=100, help_text="Referenced in prompts as @artifact:<name>.")
    content_type = models.CharField(max_length=120)
    size = models.PositiveIntegerField()
    sha256 = models.CharField(max_length=64)
    content = models.BinaryField()
    added_by = models.CharField(max_length=160, help_text="Collaborator id, such as human:alice or agent:coder.")
    created_at = models.DateTimeField(auto_now_add=True)

    objects = ArtifactQuerySet.as_manager()

    class Meta:
        ordering = ["saga", "name"]
        constraints = [models.UniqueConstraint(fields=["saga", "name"], name="artifact_saga_name_unique")]

    def __str__(self) -> str:
        return self.name

    @property
    def is_text(self) -> bool:
        return self.content_type.startswith("text/") or self.content_type in TEXT_TYPES

    @property
    def is_image(self) -> bool:
        return self.content_type.startswith("image/")

    @property
    def text(self) -> str:
        return bytes(self.content).decode("utf-8", errors="replace")
