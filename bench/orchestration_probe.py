"""Counts for bench/orchestration.py, taken inside the Celery worker processes: the bench starts its
workers with `-A bench.orchestration_probe`, which is the project's app with these counters on.

Per task, one JSON line appended to `$BENCH_PROBE_FILE`: the task's name, its wall time, the SQL
statements its connection ran, the transactions it committed (outermost atomic blocks), the
Celery messages it sent (by task name), and for each orchestration step it ran, the step, whether
it moved the prompt on, and its own statements. Nothing here changes what the tasks do.
With `BENCH_PROFILE_DIR` set, each task is also run under cProfile and its stats written there
(`<task name>-<task id>.prof`, for `python -m pstats`): where a step's milliseconds go. With
`BENCH_PROBE_SQL` set, each line also holds the task's timeline (`sql`): for every statement and
COMMIT of its connection, when it began (epoch, ms), how long it took (ms) and its first words; the
gaps between them are the Python around them (run the bench with `--keep` to read the lines).
"""

import cProfile
import json
import os
import threading
import time
from collections import Counter
from typing import Any

from celery import signals

from config.celery import app

__all__ = ["app", "install", "snapshot"]

_state: dict[str, Any] = {"statements": 0, "commits": 0, "published": Counter(), "steps": []}
if os.environ.get("BENCH_PROBE_SQL"):  # each statement and commit too, when and how long: a timeline
    _state["sql"] = []


def _on_main_thread() -> bool:
    # The heartbeat thread renews leases on its own connection: not the task's work.
    return threading.current_thread() is threading.main_thread()


def count_statement(execute: Any, sql: str, params: Any, many: bool, context: dict[str, Any]) -> Any:
    if not _on_main_thread():
        return execute(sql, params, many, context)
    _state["statements"] += 1
    if "sql" not in _state:
        return execute(sql, params, many, context)
    began = time.time()
    try:
        return execute(sql, params, many, context)
    finally:  # when it began (epoch, ms), how long it took (ms), its first words
        ended = time.time()
        _state["sql"].append([round(began * 1000, 2), round((ended - began) * 1000, 3), " ".join(sql.split())[:90]])


def install() -> None:
    """Count on this process's connection, its commits and the messages it sends."""
    from django.db import connection
    from django.db.backends.base.base import BaseDatabaseWrapper

    if count_statement not in connection.execute_wrappers:
        connection.execute_wrappers.append(count_statement)
    if not getattr(BaseDatabaseWrapper.commit, "counted", False):
        commit = BaseDatabaseWrapper.commit

        def counted_commit(self: Any) -> None:
            if not _on_main_thread():
                return commit(self)
            _state["commits"] += 1
            began = time.time()
            commit(self)
            if "sql" in _state:
                _state["sql"].append([round(began * 1000, 2), round((time.time() - began) * 1000, 3), "COMMIT"])

        counted_commit.counted = True  # type: ignore[attr-defined]
        BaseDatabaseWrapper.commit = counted_commit  # type: ignore[method-assign]
    wrap_steps()


def wrap_steps() -> None:
    from agents.orchestrator import steps

    for name, step in list(steps.STEPS.items()):
        if not getattr(step, "counted", False):
            steps.STEPS[name] = counting(str(name), step)


def counting(name: str, step: Any) -> Any:
    def counted(*args: Any) -> bool:  # (prompt) before the steps handed runs back, (prompt, here) since
        before = _state["statements"]
        moved = step(*args)
        _state["steps"].append({"step": name, "moved": bool(moved), "statements": _state["statements"] - before})
        return bool(moved)

    counted.counted = True  # type: ignore[attr-defined]
    return counted


def snapshot() -> dict[str, Any]:
    """This process's counters since the last snapshot (and reset them)."""
    taken = {
        "statements": _state["statements"],
        "commits": _state["commits"],
        "published": dict(_state["published"]),
        "steps": list(_state["steps"]),
    }
    if "sql" in _state:
        taken["sql"], _state["sql"] = _state["sql"], []
    _state.update(statements=0, commits=0, published=Counter(), steps=[])
    return taken


@signals.before_task_publish.connect
def _published(sender: str | None = None, **_: Any) -> None:
    _state["published"][sender or "?"] += 1


@signals.worker_process_init.connect
def _process_init(**_: Any) -> None:
    install()


_started: dict[str, float] = {}
_profiles: dict[str, cProfile.Profile] = {}


@signals.task_prerun.connect
def _prerun(task_id: str | None = None, **_: Any) -> None:
    snapshot()
    _started[task_id or ""] = time.perf_counter()
    if os.environ.get("BENCH_PROFILE_DIR"):
        _profiles[task_id or ""] = profile = cProfile.Profile()
        profile.enable()


@signals.task_postrun.connect
def _postrun(task_id: str | None = None, task: Any = None, **_: Any) -> None:
    wall = time.perf_counter() - _started.pop(task_id or "", time.perf_counter())
    name = getattr(task, "name", "?")
    profile = _profiles.pop(task_id or "", None)
    if profile is not None:
        profile.disable()
        profile.dump_stats(os.path.join(os.environ["BENCH_PROFILE_DIR"], f"{name}-{task_id}.prof"))
    line = {"task": name, "ms": round(wall * 1000, 2), "pid": os.getpid(), **snapshot()}
    path = os.environ.get("BENCH_PROBE_FILE")
    if path:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, (json.dumps(line) + "\n").encode())
        finally:
            os.close(fd)
