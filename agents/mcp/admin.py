from django.contrib import admin

from agents.mcp.models import McpServer
from config.admin_lists import ListsAdmin


@admin.register(McpServer)
class McpServerAdmin(ListsAdmin):
    """Servers are configuration, edited here or loaded from the profiles file; no secret is ever stored."""

    list_display = ("name", "transport", "command", "url", "allowed_tools", "call_timeout_s", "enabled", "updated_at")
    list_filter = ("transport", "enabled")
    search_fields = ("name", "command", "url")
