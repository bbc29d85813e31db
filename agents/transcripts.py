"""A run's transcript: its conversation as persisted, read back a task at a time, and kept in this
process between tasks of the same run so that only the newest entries are read again."""

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from django.db import connection
from django.utils import timezone

from agents.models import TranscriptEntry
from config.sql import db_value, defer, prepared, py_value, rows_later


class Transcript:
    """A run's conversation, in the chat-completions shape, so any run can resume from exactly what
    was persisted. Append-only: a copy this process kept from an earlier task of the run only needs
    the entries written since."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.messages: list[dict[str, Any]] = []
        self.last_seq = 0
        self.tokens = 0
        self.unsaved: list[tuple[int, int, dict[str, Any], int]] = []  # (seq, turn, message, tokens)

    def read_new(self) -> None:
        with connection.cursor() as cursor:
            cursor.execute(_READ_SQL, [self.run_id, self.last_seq])
            self.add(cursor.fetchall())

    def add(self, rows: list[tuple[Any, ...]]) -> None:
        """Entries read from the database (_READ_SQL), after those it holds."""
        for seq, message, tokens in rows:
            self.messages.append(py_value(TranscriptEntry, "message", message))
            self.last_seq, self.tokens = seq, self.tokens + tokens

    def append(self, turn: int, messages: list[dict[str, Any]], *, tokens: int = 0) -> None:
        """Add messages, written by save() at the end of the turn's transaction."""
        for message in messages:
            self.last_seq += 1
            self.unsaved.append((self.last_seq, turn, message, tokens))
            self.messages.append(message)
            self.tokens, tokens = self.tokens + tokens, 0

    def save(self) -> int:
        """One plain multi-row INSERT: every transaction of every turn ends with it. Returns the
        tokens of the entries it wrote."""
        if not self.unsaved:
            return 0
        tokens = sum(entry[3] for entry in self.unsaved)
        created = db_value(TranscriptEntry, "created_at", timezone.now())
        params = [
            value
            for seq, turn, message, tokens in self.unsaved
            for value in (self.run_id, seq, turn, db_value(TranscriptEntry, "message", message), tokens, created)
        ]
        # Nothing reads its outcome, and it ends the transaction: on PostgreSQL it goes with the COMMIT.
        defer(_INSERT_SQL + ", ".join(["(%s, %s, %s, %s, %s, %s)"] * len(self.unsaved)), params)
        self.unsaved = []
        return tokens


_READ_SQL = prepared(
    f"SELECT seq, message, tokens FROM {TranscriptEntry._meta.db_table} WHERE run_id = %s AND seq > %s ORDER BY seq"
)
_INSERT_SQL = f"INSERT INTO {TranscriptEntry._meta.db_table} (run_id, seq, turn, message, tokens, created_at) VALUES "


Ahead = Callable[[], list[tuple[Any, ...]]]  # the rows of a deferred _READ_SQL: read_ahead()

# The transcripts of the runs this process ran last, as of their tasks' last commit, with the run's
# turn then.
_kept: OrderedDict[str, tuple[int, Transcript]] = OrderedDict()
KEPT_TRANSCRIPTS = 64


def take_transcript(run_id: str, *, turn: int, ahead: Ahead | None = None) -> Transcript:
    """The run's transcript, in the transaction that claimed the run at `turn` (its turn number as
    queued). Only turns write transcripts, and each claim moves the turn on: a copy kept at that
    same turn is the whole transcript, and nothing needs reading; a run never claimed (turn 0) has
    none yet. `ahead`: what read_ahead() read with the claim, which is all that is missing."""
    kept_turn, transcript = _kept.pop(run_id, (None, None))
    if transcript is None:
        transcript = Transcript(run_id)
    if ahead is not None:
        transcript.add(ahead())
    elif kept_turn != turn and turn > 0:
        transcript.read_new()
    return transcript


def read_ahead(run_id: str) -> Ahead | None:
    """On PostgreSQL, before the run's claim is known, for take_transcript(): the run's whole
    transcript when this process keeps no copy of it, read with the transaction's next statement
    (config.sql.defer), so that the read costs no round trip of its own. None when this process
    keeps a copy (most likely as the run stands: take_transcript() checks it against the claimed
    turn, and reads what is missing if not), and on SQLite, where no statement costs a round trip."""
    kept = _kept.get(run_id)
    if connection.vendor == "sqlite" or kept is not None:
        return None
    return rows_later(_READ_SQL, [run_id, 0])


def keep_transcript(transcript: Transcript, *, turn: int) -> None:
    """Only after a task that ended normally: everything it holds is committed, and `turn` is the
    run's turn number."""
    _kept[transcript.run_id] = (turn, transcript)
    while len(_kept) > KEPT_TRANSCRIPTS:
        _kept.popitem(last=False)
