"""Django's SQLite backend, with writers queued on a file lock instead of in SQLite's busy handler.

SQLite takes one writer at a time. A writer that finds the database locked sleeps in SQLite's
busy handler in growing steps (1, 2, 5, 10 ms and more) and usually wakes well after the lock
was free: with a web process and worker processes sharing the database, most of a contended
write is that sleep. Here each write transaction first takes an exclusive `flock` on a file next
to the database, and releases it at commit or rollback; a waiting writer looks again every tenth
of a millisecond (every millisecond once it has waited long), and its BEGIN IMMEDIATE then finds
the database free.
Statements outside transactions and other programs still meet the busy timeout, as before.
"""

import fcntl
import os
import time
from functools import lru_cache
from typing import Any

from django.db import OperationalError
from django.db.backends.sqlite3 import base


class CursorWrapper(base.SQLiteCursorWrapper):
    """Remembers the qmark form of the statements it runs: the same few run over and over."""

    def convert_query(self, query: str, *, param_names: list[str] | None = None) -> str:
        if param_names is None:
            return qmark(query)
        return super().convert_query(query, param_names=param_names)


@lru_cache(maxsize=4096)
def qmark(query: str) -> str:
    return base.FORMAT_QMARK_REGEX.sub("?", query).replace("%%", "%")


class DatabaseWrapper(base.DatabaseWrapper):
    writer_lock: tuple[int, int] | None = None  # (pid, fd): a forked child opens its own
    holds_writer_lock = False

    def create_cursor(self, name: str | None = None) -> Any:
        return self.connection.cursor(factory=CursorWrapper)

    def _start_transaction_under_autocommit(self) -> None:
        if not self.is_in_memory_db():
            self.take_writer_lock()
        try:
            super()._start_transaction_under_autocommit()  # type: ignore[misc]  # private in the stubs
        except BaseException:
            self.release_writer_lock()
            raise

    def _commit(self) -> Any:
        try:
            return super()._commit()  # type: ignore[misc]  # private in the stubs
        finally:
            self.release_writer_lock()

    def _rollback(self) -> Any:
        try:
            return super()._rollback()  # type: ignore[misc]  # private in the stubs
        finally:
            self.release_writer_lock()

    def _close(self) -> Any:
        try:
            return super()._close()  # type: ignore[misc]  # private in the stubs
        finally:
            self.release_writer_lock()
            if self.writer_lock is not None and self.writer_lock[0] == os.getpid():
                os.close(self.writer_lock[1])
            self.writer_lock = None

    def take_writer_lock(self) -> None:
        if self.writer_lock is None or self.writer_lock[0] != os.getpid():
            path = f"{self.settings_dict['NAME']}.writer-lock"
            self.writer_lock = (os.getpid(), os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600))
        # Polled in short steps rather than blocking, so that a writer stuck in a transaction makes
        # the others fail after the configured timeout, as SQLite's own lock would, not hang.
        # Every moment the lock lies free while its next writer sleeps is lost to all writers: look
        # again every 0.1 ms while transactions are short, every millisecond after a long wait.
        started = time.monotonic()
        deadline = started + float(self.settings_dict["OPTIONS"].get("timeout", 5))
        pause = 0.00002
        while True:
            try:
                fcntl.flock(self.writer_lock[1], fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                now = time.monotonic()
                if now > deadline:
                    raise OperationalError("database is locked: another writer held it too long") from None
                time.sleep(pause)
                pause = min(pause * 2, 0.0001 if now - started < 0.05 else 0.001)
        self.holds_writer_lock = True

    def release_writer_lock(self) -> None:
        if self.holds_writer_lock and self.writer_lock is not None:
            fcntl.flock(self.writer_lock[1], fcntl.LOCK_UN)
            self.holds_writer_lock = False
