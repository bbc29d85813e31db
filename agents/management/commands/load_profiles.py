from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from agents.actions import load_profiles
from agents.management.loading import LOAD_ERRORS, read_entries
from agents.mcp.actions import load_mcp_servers


class Command(BaseCommand):
    help = (
        "Create or update agent profiles from a JSON or YAML file (a list of profiles, or an object with "
        '"profiles" and "mcp_servers" lists); loading twice updates.'
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", type=Path)

    def handle(self, *args: Any, file: Path, **options: Any) -> None:
        try:
            entries = read_entries(file)
            servers: Any = []
            if isinstance(entries, dict):
                if not set(entries) <= {"profiles", "mcp_servers"}:
                    raise ValueError('A profiles file holds a list of objects, or "profiles" and "mcp_servers".')
                entries, servers = entries.get("profiles", []), entries.get("mcp_servers", [])
            with transaction.atomic():
                servers_created, servers_updated = load_mcp_servers(entries=servers)
                created, updated = load_profiles(entries=entries)
        except LOAD_ERRORS as exc:
            raise CommandError(f"{file}: {exc}") from exc
        self.stdout.write(f"{created} profiles created, {updated} updated.")
        if servers:
            self.stdout.write(f"{servers_created} MCP servers created, {servers_updated} updated.")
