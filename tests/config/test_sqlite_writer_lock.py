"""The SQLite backend's writer queue (config/sqlite/base.py): a write transaction holds an exclusive
lock on a file beside the database from BEGIN to its commit or rollback, and only then."""

import fcntl
import os
import threading

import pytest
from django.db import OperationalError, connection, transaction

from accounts.models import User

pytestmark = [
    pytest.mark.skipif(connection.vendor != "sqlite", reason="the writer lock is the SQLite backend's"),
    pytest.mark.django_db(transaction=True),
]


def writer_lock_is_free() -> bool:
    """Whether another writer (here: another open file, as another process has) could take it now."""
    fd = os.open(f"{connection.settings_dict['NAME']}.writer-lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return True
    finally:
        os.close(fd)


def test_a_write_transaction_holds_the_writer_lock_until_it_commits() -> None:
    with transaction.atomic():
        User.objects.create_user(username="writer")
        assert not writer_lock_is_free()
    assert writer_lock_is_free()
    assert User.objects.filter(username="writer").exists()


def test_a_rolled_back_transaction_releases_the_writer_lock() -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        User.objects.create_user(username="undone")
        assert not writer_lock_is_free()
        raise RuntimeError
    assert writer_lock_is_free()
    assert not User.objects.filter(username="undone").exists()


def test_closing_the_connection_mid_transaction_releases_the_writer_lock() -> None:
    with transaction.atomic():
        User.objects.create_user(username="abandoned")
        assert not writer_lock_is_free()
        connection.close()  # as when a worker process is told to drop its connection
        assert writer_lock_is_free()
    assert not User.objects.filter(username="abandoned").exists()


def test_a_writer_waits_for_the_lock_and_gives_up_after_the_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(connection.settings_dict["OPTIONS"], "timeout", 0.3)
    other_writer = os.open(f"{connection.settings_dict['NAME']}.writer-lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(other_writer, fcntl.LOCK_EX)
    try:
        with pytest.raises(OperationalError, match="database is locked"), transaction.atomic():
            User.objects.create_user(username="too-late")

        released = threading.Timer(0.1, fcntl.flock, args=(other_writer, fcntl.LOCK_UN))
        released.start()
        with transaction.atomic():  # waits for the other writer, then goes ahead
            User.objects.create_user(username="in-time")
        released.join()
    finally:
        os.close(other_writer)
    assert list(User.objects.filter(username__in=["too-late", "in-time"]).values_list("username", flat=True)) == [
        "in-time"
    ]
