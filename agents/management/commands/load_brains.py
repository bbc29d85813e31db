from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from agents.management.loading import LOAD_ERRORS, read_entries
from agents.orchestrator.actions import load_brains


class Command(BaseCommand):
    help = "Create or update orchestrator brains from a JSON or YAML file (a list of brains); loading twice updates."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", type=Path)

    def handle(self, *args: Any, file: Path, **options: Any) -> None:
        try:
            entries = read_entries(file)
            created, updated = load_brains(entries=entries)
        except LOAD_ERRORS as exc:
            raise CommandError(f"{file}: {exc}") from exc
        self.stdout.write(f"{created} brains created, {updated} updated.")
