"""The heartbeat: one thread per worker process that renews the leases of the turns the process is
running, so that a long turn (a slow model call) keeps its run."""

import logging
import threading
import time
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import connection

from config.per_process import PerProcess
from sagas import actions

if TYPE_CHECKING:
    from agents.turns import Turns

logger = logging.getLogger(__name__)


class Heartbeat(threading.Thread):
    """Renews the leases of the turns this process is running, so that a long turn (a slow model
    call) keeps its run, following each run's turn number as its task goes from turn to turn. One
    thread per process, started with its first task (again in a forked pool process)."""

    def __init__(self) -> None:
        super().__init__(daemon=True, name="heartbeat")
        self.beating: dict[str, Turns] = {}  # by run id
        self.lock = threading.Lock()

    def add(self, turns: "Turns") -> None:
        with self.lock:
            self.beating[turns.run.pk] = turns

    def remove(self, turns: "Turns") -> None:
        with self.lock:
            if self.beating.get(turns.run.pk) is turns:
                del self.beating[turns.run.pk]

    def run(self) -> None:
        while True:
            time.sleep(settings.AGORA_LEASE_S / 3)
            with self.lock:
                beating = list(self.beating.values())
            # A renewal that finds no row (the turn taken over: its next write finds out,
            # LostTurn) changes nothing; the task removes its turns when it ends.
            failed = False
            for turns in beating:
                try:
                    actions.renew_lease(run_id=turns.run.pk, turn=turns.turn)
                except Exception:  # the database is away: try again at the next beat
                    failed = True
                    logger.exception("lease renewal of %s failed", turns.run.pk)
            # The thread's connection stays open from beat to beat while turns beat (a long model
            # call is renewed at every beat: one connection, not one per beat), and is closed once
            # none do, or after a failure (the next beat connects afresh).
            if failed or not beating:
                connection.close()


def started() -> Heartbeat:
    beat = Heartbeat()
    beat.start()
    return beat


heartbeat = PerProcess(started)
