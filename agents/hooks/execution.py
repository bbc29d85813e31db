"""Running one handler of each type, with its timeout, and reading what it said.

Each handler runs in a thread of its own (the runner starts them all at once). A command runs as
its own process group, so that a timed-out command is killed with whatever it started.
"""

import contextlib
import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Any

import httpx
from django.utils.module_loading import import_string

from agents.hooks.models import HookHandler

MAX_OUTPUT_CHARS = 64 * 1024  # what is kept of a handler's output; the rest is cut
STDERR_CHARS = 500  # enough of stderr to say why a command failed


@dataclass(frozen=True)
class Raw:
    """What a handler gave back before interpretation: its text output, or why there is none."""

    output: str = ""
    value: dict[str, Any] | None = None  # a python handler's dict, taken as a JSON object
    error: str = ""
    timed_out: bool = False
    duration_ms: int = 0


def run_handler(handler: HookHandler, event_json: str) -> Raw:
    started = time.monotonic()
    try:
        raw = run_any(handler, event_json)
    except Exception as exc:  # noqa: BLE001 - whatever goes wrong in a handler's thread is its outcome
        raw = Raw(error=f"{type(exc).__name__}: {exc}")
    return Raw(
        output=raw.output[:MAX_OUTPUT_CHARS],
        value=raw.value,
        error=raw.error,
        timed_out=raw.timed_out,
        duration_ms=round((time.monotonic() - started) * 1000),
    )


def run_any(handler: HookHandler, event_json: str) -> Raw:
    if handler.type == HookHandler.Type.COMMAND:
        return run_command(handler.argv, event_json, handler.timeout_s)
    if handler.type == HookHandler.Type.WEBHOOK:
        return post_webhook(handler.url, event_json, handler.timeout_s)
    return call_python(handler.callable, event_json)


def run_command(argv: list[str], event_json: str, timeout_s: float) -> Raw:
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            encoding="utf-8",
            errors="replace",  # a stray byte is not worth losing the rest of what it said
        )
    except OSError as exc:
        return Raw(error=f"could not start: {exc}")
    try:
        stdout, stderr = proc.communicate(event_json, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return Raw(timed_out=True, error=f"killed after {timeout_s:g} s")
    if proc.returncode != 0:
        return Raw(output=stdout, error=f"exit status {proc.returncode}: {stderr.strip()[:STDERR_CHARS]}")
    return Raw(output=stdout)


def post_webhook(url: str, event_json: str, timeout_s: float) -> Raw:
    try:
        response = httpx.post(
            url,
            content=event_json.encode(),
            headers={"Content-Type": "application/json"},
            timeout=timeout_s,
            follow_redirects=False,
        )
    except httpx.TimeoutException:
        return Raw(timed_out=True, error=f"no answer within {timeout_s:g} s")
    except httpx.HTTPError as exc:
        return Raw(error=f"{type(exc).__name__}: {exc}")
    if not response.is_success:
        return Raw(output=response.text, error=f"HTTP {response.status_code}")
    return Raw(output=response.text)


def call_python(path: str, event_json: str) -> Raw:
    """Call `path(event)`; it returns a dict (taken as the JSON object), a string (taken as
    stdout) or None. It cannot be killed: at its timeout the runner stops waiting for it."""
    try:
        function = import_string(path)
        result = function(json.loads(event_json))
    except Exception as exc:  # noqa: BLE001 - a handler's bug is journaled, never the orchestration's crash
        return Raw(error=f"{type(exc).__name__}: {exc}")
    if result is None:
        return Raw()
    if isinstance(result, dict):
        return Raw(value=result)
    if isinstance(result, str):
        return Raw(output=result)
    return Raw(error=f"returned a {type(result).__name__}, not a dict, a string or None")
