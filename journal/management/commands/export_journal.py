from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from journal.access import Everything, saga_model
from journal.export import iter_jsonl


class Command(BaseCommand):
    help = "Write a saga's journal as JSON lines to standard output."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("saga_id")
        parser.add_argument("--after", type=int, default=0, help="Only events with a greater seq.")

    def handle(self, *args: Any, saga_id: str, after: int, **options: Any) -> None:
        try:
            exists = saga_model().objects.filter(pk=saga_id).exists()
        except (ValueError, ValidationError) as exc:  # a malformed UUID raises ValidationError
            raise CommandError(f"Not a saga id: {saga_id}") from exc
        if not exists:
            raise CommandError(f"No saga {saga_id}.")
        for line in iter_jsonl(saga_id, lens=Everything(), after=after):
            self.stdout.write(line, ending="")
