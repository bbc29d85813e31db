"""What an ask's read and a run's ending cost as an agent's history of answered requests grows.

    .venv/bin/python bench/ask_history.py [--history 0,2000,20000] [--calls 300]

Every `ask_agent` reads, in one statement (`sagas.actions.requests.read_ask`), how many requests its
sender has open, the deepest hop among those its recipient has open, and whether the idempotency
key was used; a run that ends reads the requests still open to it (`_STRANDED_SQL`). Both should
cost the same whatever the agents sent and answered before. Here agent A has sent agent B a
growing number of answered requests (and three still open), PostgreSQL's statistics are
fresh (ANALYZE, as autovacuum keeps them; Agora never analyzes SQLite, whose planner then goes by
its rules), and each read is timed `--calls` times as the hot path runs it (on PostgreSQL a
prepared statement with its generic plan, config/postgresql/base.py). Printed: the median per
history size, and its ratio to the read with no history, measured in the same run.

Runs on SQLite and, when it answers, on PostgreSQL (bench/growth.py).
"""

import sys
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.growth import analyze, main, median_us

OPEN = 3  # of A's requests to B, the first few are still open; the rest answered


def measure(sizes: list[int], calls: int) -> dict[str, Any]:
    """In the child: the medians, in microseconds, per history size."""
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection
    from django.utils import timezone

    from accounts.models import User
    from config.sql import fetch
    from sagas.actions import add_agent, create_saga
    from sagas.actions.requests import read_ask
    from sagas.actions.runs import _STRANDED_SQL
    from sagas.models import AgentRequest, Collaborator

    call_command("migrate", verbosity=0)
    owner = User.objects.create_user(f"bench-{uuid.uuid4().hex[:8]}")
    saga = create_saga(title="Ask history", owner=owner)
    for name in ("a", "b"):
        add_agent(saga=saga, name=name, role="r", task="t", runtime="external", by=owner)
    a, b = (Collaborator.objects.get(saga=saga, name=name) for name in ("a", "b"))

    def requests(n: int, status: str) -> None:
        now = timezone.now()
        fields = {"saga": saga, "sender": a, "recipient": b, "type": "t", "payload": {}, "reply": {}}
        AgentRequest.objects.bulk_create(
            [AgentRequest(**fields, expires_at=now, status=status) for _ in range(n)], batch_size=2000
        )

    results: dict[str, Any] = {"vendor": connection.vendor, "sizes": {}}
    requests(OPEN, "pending")
    made = 0
    for size in sizes:
        requests(size - made, "completed")
        made = size
        analyze()
        results["sizes"][size] = {
            "ask": median_us(lambda: read_ask(saga, a, "b"), calls),
            "ending": median_us(lambda: fetch(_STRANDED_SQL, [b.pk], AgentRequest, Collaborator, Collaborator), calls),
        }
    return results


if __name__ == "__main__":
    main(
        __file__, __doc__ or "", measure, history="answered requests", what="read",
        reads={"ask": "ask read", "ending": "ending read"},
    )  # fmt: skip
