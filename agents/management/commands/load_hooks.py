from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from agents.hooks.actions import load_hooks
from agents.management.loading import LOAD_ERRORS, read_entries


class Command(BaseCommand):
    help = (
        "Create or update hook handlers from a JSON or YAML file (a list of handlers); loading twice updates. "
        'A handler without "trusted": true is refused, and so is the whole file.'
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", type=Path)

    def handle(self, *args: Any, file: Path, **options: Any) -> None:
        try:
            entries = read_entries(file)
            created, updated = load_hooks(entries=entries)
        except LOAD_ERRORS as exc:
            raise CommandError(f"{file}: {exc}") from exc
        self.stdout.write(f"{created} hooks created, {updated} updated.")
