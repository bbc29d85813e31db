import json
from pathlib import Path
from typing import Any

import yaml
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from agents.orchestrator.actions import load_brains


class Command(BaseCommand):
    help = "Create or update orchestrator brains from a JSON or YAML file (a list of brains); loading twice updates."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", type=Path)

    def handle(self, *args: Any, file: Path, **options: Any) -> None:
        try:
            text = file.read_text()
            entries = yaml.safe_load(text) if file.suffix in (".yaml", ".yml") else json.loads(text)
            created, updated = load_brains(entries=entries)
        except (OSError, ValueError, yaml.YAMLError, ValidationError) as exc:
            raise CommandError(f"{file}: {exc}") from exc
        self.stdout.write(f"{created} brains created, {updated} updated.")
