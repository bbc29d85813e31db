import hashlib
import secrets

from django.contrib.auth.models import AbstractUser
from django.db import models


class User(AbstractUser):
    """A principal: a person who signs in, or an agent's service user (no password, never a login)."""

    class Kind(models.TextChoices):
        HUMAN = "human"
        AGENT = "agent"

    kind = models.CharField(max_length=8, choices=Kind.choices, default=Kind.HUMAN)

    @property
    def is_agent(self) -> bool:
        return self.kind == self.Kind.AGENT


def hash_token(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class ApiTokenQuerySet(models.QuerySet["ApiToken"]):
    def matching(self, key: str) -> "ApiTokenQuerySet":
        return self.filter(key_hash=hash_token(key), user__is_active=True)


class ApiToken(models.Model):
    """An API token. Only its SHA-256 is stored; the key itself is shown once, when it is issued."""

    user = models.ForeignKey(User, on_delete=models.CASCADE, related_name="api_tokens")
    key_hash = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=12, help_text="The first characters, to recognise a token.")
    created_at = models.DateTimeField(auto_now_add=True)

    objects = ApiTokenQuerySet.as_manager()

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.user})"

    @staticmethod
    def new_key(prefix: str) -> str:
        return f"{prefix}{secrets.token_urlsafe(32)}"
