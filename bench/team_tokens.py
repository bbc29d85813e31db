"""What a teammate's budget check costs as its team's transcripts grow: the team's total, against
the sum over every teammate's transcript that it replaced, in the same run.

    .venv/bin/python bench/team_tokens.py [--history 0,2000,20000] [--calls 300]

Every turn of a teammate starts by reading its team's token budget and what the team has used
(`agents.turns._TEAM_TOKENS_SQL`): now one row, the `tokens_used` its teammates' turns add to.
Before, it summed the tokens of every transcript entry of every teammate. Here a team of two
teammates gets a growing number of transcript entries (`--history`, split between them), and both
reads are timed `--calls` times as the hot path runs them (on PostgreSQL prepared, with fresh
statistics). Printed: the median per history size, and its ratio to the read with no history.

Runs on SQLite and, when it answers, on PostgreSQL (bench/growth.py).
"""

import sys
import uuid
from pathlib import Path
from typing import Any

BASE_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE_DIR))

from bench.growth import analyze, main, median_us  # noqa: E402


def measure(sizes: list[int], calls: int) -> dict[str, Any]:
    """In the child: the medians, in microseconds, per history size."""
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from accounts.models import User
    from agents.models import TranscriptEntry
    from agents.turns import _TEAM_TOKENS_SQL
    from config.sql import prepared
    from sagas import actions
    from sagas.models import Run, Team

    call_command("migrate", verbosity=0)
    call_command("load_profiles", str(BASE_DIR / "agents/profiles/default.json"), verbosity=0)
    owner = User.objects.create_user(f"bench-{uuid.uuid4().hex[:8]}")
    saga = actions.create_saga(title="Team tokens", owner=owner)
    lead, _ = actions.add_agent(saga=saga, name="lead", role="Lead", task="t", runtime="external", by=owner)
    profile = "assistant"
    mates = [
        actions.spawn_teammate(lead=lead, name=name, role="Mate", prompt="p", profile=profile, by=owner)[0]
        for name in ("ann", "ben")
    ]
    runs = [Run.objects.get(collaborator=mate) for mate in mates]
    team = Team.objects.get(lead=lead)
    summed = prepared(  # the check before: every entry of every teammate's transcript
        f"SELECT t.max_tokens, (SELECT COALESCE(SUM(e.tokens), 0) FROM {TranscriptEntry._meta.db_table} e "
        f"JOIN {Run._meta.db_table} r ON r.id = e.run_id WHERE r.team_id = t.id) FROM {Team._meta.db_table} t "
        "WHERE t.id = %s"
    )

    def timed(sql: str) -> float:
        with connection.cursor() as cursor:
            return median_us(lambda: cursor.execute(sql, [team.pk]).fetchone(), calls)

    results: dict[str, Any] = {"vendor": connection.vendor, "sizes": {}}
    made = 0
    for size in sizes:
        TranscriptEntry.objects.bulk_create(
            [
                TranscriptEntry(run=runs[seq % 2], seq=seq, turn=seq, message={"role": "assistant", "content": "x"},
                                tokens=18)
                for seq in range(made + 1, size + 1)
            ],
            batch_size=2000,
        )  # fmt: skip
        made = size
        analyze()
        results["sizes"][size] = {"summed": timed(summed), "total": timed(_TEAM_TOKENS_SQL)}
    return results


if __name__ == "__main__":
    main(
        __file__, __doc__ or "", measure, history="transcript entries", what="budget check",
        reads={"summed": "sum (before)", "total": "team total"},
    )  # fmt: skip
