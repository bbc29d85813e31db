import json

from django.contrib import admin
from django.http import HttpRequest
from django.utils.html import format_html

from agents.hooks import admin as hooks_admin  # noqa: F401  (registers hook handlers and results)
from agents.models import AgentProfile, TranscriptEntry
from config.admin_lists import ListsAdmin


@admin.register(AgentProfile)
class AgentProfileAdmin(ListsAdmin):
    list_display = ("name", "role", "model", "fallback_models", "resumable", "max_turns", "updated_at")
    search_fields = ("name", "role", "model")
    list_filter = ("resumable", "endpoint")


@admin.register(TranscriptEntry)
class TranscriptEntryAdmin(ListsAdmin):
    """A run's conversation, for inspection only: it is what a crashed run resumes from."""

    list_display = ("run", "seq", "turn", "role", "tokens", "created_at")
    list_filter = ("turn",)
    search_fields = ("=run__id",)
    fields = ("run", "seq", "turn", "tokens", "created_at", "pretty_message")
    readonly_fields = fields

    @admin.display(description="role")
    def role(self, entry: TranscriptEntry) -> str:
        return str(entry.message.get("role", ""))

    @admin.display(description="message")
    def pretty_message(self, entry: TranscriptEntry) -> str:
        return format_html("<pre>{}</pre>", json.dumps(entry.message, indent=2, ensure_ascii=False))

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: TranscriptEntry | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: TranscriptEntry | None = None) -> bool:
        return False


from agents.mcp import admin as mcp_admin  # noqa: E402, F401  (the MCP servers' admin)
from agents.orchestrator import admin as orchestrator_admin  # noqa: E402, F401  (registers brains and prompts)
