from typing import Any

from django.db import transaction

from agents.actions import repeated
from agents.mcp.models import McpServer

SERVER_FIELDS = {f.name for f in McpServer._meta.get_fields()} - {"id", "updated_at"}


class InvalidServers(ValueError):
    pass


@transaction.atomic
def load_mcp_servers(*, entries: Any) -> tuple[int, int]:
    """Create or update MCP servers by name; all of them or none. Returns (created, updated)."""
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise InvalidServers("mcp_servers holds a list of objects.")
    if (twice := repeated([entry.get("name") for entry in entries])) is not None:
        raise InvalidServers(f"MCP server {twice!r} is in the file twice.")
    created = updated = 0
    for entry in entries:
        if missing := {"name", "transport"} - set(entry):
            raise InvalidServers(f"MCP server {entry.get('name', '?')!r} lacks {', '.join(sorted(missing))}.")
        if unknown := set(entry) - SERVER_FIELDS:
            raise InvalidServers(f"MCP server {entry['name']!r} has unknown keys: {', '.join(sorted(unknown))}.")
        server = McpServer.objects.filter(name=entry["name"]).first() or McpServer(name=entry["name"])
        is_new = server.pk is None
        for key, value in entry.items():
            setattr(server, key, value)
        server.full_clean()
        server.save()
        created, updated = created + is_new, updated + (not is_new)
    return created, updated
