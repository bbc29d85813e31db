from django.db import models

from sagas.models import AgentRequest


class PushConfig(models.Model):
    """Where to push an A2A task's state changes: a client's webhook, registered with the task
    (SendMessage's configuration) or after it (CreateTaskPushNotificationConfig)."""

    request = models.ForeignKey(AgentRequest, on_delete=models.CASCADE, related_name="+")
    config_id = models.CharField(max_length=100)
    url = models.URLField(max_length=2000)
    token = models.CharField(max_length=500, blank=True, help_text="Sent back as X-A2A-Notification-Token.")
    auth_scheme = models.CharField(max_length=50, blank=True)
    auth_credentials = models.CharField(max_length=2000, blank=True)
    pushed_state = models.CharField(max_length=40, blank=True, help_text="The last task state the webhook took.")
    failures = models.PositiveIntegerField(default=0, help_text="Failed deliveries of the current state.")
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["request", "config_id"], name="a2a_push_config_unique")]

    def __str__(self) -> str:
        return f"{self.request_id}/{self.config_id} → {self.url}"
