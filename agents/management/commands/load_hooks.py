import json
from pathlib import Path
from typing import Any

import yaml
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from agents.hooks.actions import load_hooks


class Command(BaseCommand):
    help = (
        "Create or update hook handlers from a JSON or YAML file (a list of handlers); loading twice updates. "
        'A handler without "trusted": true is refused, and so is the whole file.'
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", type=Path)

    def handle(self, *args: Any, file: Path, **options: Any) -> None:
        try:
            text = file.read_text()
            entries = yaml.safe_load(text) if file.suffix in (".yaml", ".yml") else json.loads(text)
            created, updated = load_hooks(entries=entries)
        except (OSError, ValueError, yaml.YAMLError, ValidationError) as exc:
            raise CommandError(f"{file}: {exc}") from exc
        self.stdout.write(f"{created} hooks created, {updated} updated.")
