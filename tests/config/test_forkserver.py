"""The suite's fork server (tests/forkserver.py): a child is what `python -m module args` would be."""

import json
import signal
import subprocess
from pathlib import Path

import pytest

from tests.forkserver import ForkedProcess, spawn
from tests.support import BASE_DIR, exited, kill_group, stop_process, wait_until

CHILD = "tests.config.forked_child"


def test_a_child_runs_the_module_with_its_own_env_cwd_session_and_log(tmp_path: Path) -> None:
    log = tmp_path / "child.log"
    proc = spawn(CHILD, ["3", "more"], cwd=tmp_path, env={"AGORA_PROBE": "mine", "PATH": "/usr/bin"}, log=log)
    assert isinstance(proc, ForkedProcess)
    assert proc.wait(timeout=20) == 3
    first, last = log.read_text().splitlines()
    assert last == "atexit ran"  # it exited as an interpreter does, not with os._exit()
    assert json.loads(first) == {
        "probe": "mine", "cwd": str(tmp_path), "session": proc.pid, "pid": proc.pid, "argv": ["3", "more"],
        "stdin": "", "main": "__main__",
    }  # fmt: skip


def test_a_killed_child_stays_unreaped_until_polled_then_reports_the_signal(tmp_path: Path) -> None:
    proc = spawn(CHILD, ["wait"], cwd=BASE_DIR, env={}, log=tmp_path / "child.log")
    wait_until(lambda: (tmp_path / "child.log").read_text(), what="the child to start")
    assert proc.poll() is None and not exited(proc, 0.1)
    kill_group(proc)
    assert exited(proc, 20)
    assert proc.returncode is None  # its pid, the group's id, is still its own: no late signal hits another
    assert proc.wait(timeout=20) == -signal.SIGKILL
    kill_group(proc)  # reaped: nothing is signalled


def test_stop_process_ends_a_child_with_sigterm_and_a_slow_wait_times_out(tmp_path: Path) -> None:
    proc = spawn(CHILD, ["wait"], cwd=BASE_DIR, env={}, log=tmp_path / "child.log")
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=0.2)
    stop_process(proc)
    assert proc.returncode == -signal.SIGTERM
