"""`load_hooks`: the handler file, loading twice, and nothing untrusted ever loaded."""

import json
import sys
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from agents.hooks.models import HookHandler
from tests.agents.hooks_support import command, python, webhook

pytestmark = pytest.mark.django_db


def load(path: Path) -> str:
    out = StringIO()
    call_command("load_hooks", str(path), stdout=out)
    return out.getvalue().strip()


def write(tmp_path: Path, entries: Any, name: str = "hooks.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(entries))
    return path


def test_loading_creates_and_loading_again_updates_in_place(tmp_path: Path) -> None:
    entries = [
        command("friday", "UserPromptSubmit", "--print", "x"),
        {**webhook("audit", "Stop", "https://audit.example/hooks"), "brain": "default"},
        python("policy", "SubagentStart", "block", matcher="coder|tester", timeout_s=2),
    ]
    assert load(write(tmp_path, entries)) == "3 hooks created, 0 updated."

    entries[0] = {**entries[0], "timeout_s": 3, "matcher": "coder"}
    assert load(write(tmp_path, entries)) == "0 hooks created, 3 updated."

    friday = HookHandler.objects.get(name="friday")
    assert (friday.timeout_s, friday.matcher, friday.argv[-2:]) == (3.0, "coder", ["--print", "x"])
    audit = HookHandler.objects.get(name="audit")
    assert (audit.brain, audit.label, audit.type) == ("default", "default/audit", "webhook")
    assert audit.url == entries[1]["url"]
    assert HookHandler.objects.count() == 3


def test_loading_yaml(tmp_path: Path) -> None:
    path = tmp_path / "hooks.yaml"
    path.write_text(
        f"- name: lint\n  event: SubagentStop\n  type: command\n  argv: [{sys.executable}, -c, 'print(1)']\n"
        "  trusted: true\n"
    )
    assert load(path) == "1 hooks created, 0 updated."
    assert HookHandler.objects.get(name="lint").argv == [sys.executable, "-c", "print(1)"]


@pytest.mark.parametrize("trusted", [None, False, "yes", 1])
def test_an_untrusted_handler_is_refused_and_so_is_the_whole_file(tmp_path: Path, trusted: Any) -> None:
    sneaky = command("sneaky", "SessionStart", "--print", "x")
    if trusted is None:
        del sneaky["trusted"]
    else:
        sneaky["trusted"] = trusted
    with pytest.raises(CommandError, match=r"Hook 'sneaky' is not trusted: review what it runs, then set \"trusted\""):
        load(write(tmp_path, [command("fine", "SessionStart"), sneaky]))
    assert not HookHandler.objects.exists()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"event": "PreToolUse"}, "event is one of SessionStart, UserPromptSubmit"),
        ({"type": "shell"}, "type is one of command, webhook, python"),
        ({"argv": "echo hi"}, "argv is a non-empty list of strings"),
        ({"argv": []}, "argv is a non-empty list of strings"),
        ({"url": "https://x.example"}, "a command hook has no url"),
        ({"matcher": "(unclosed"}, "matcher is not a valid regex"),
        ({"timeout_s": 0}, "timeout_s is a number of seconds"),
        ({"timeout_s": 10_000}, "at most 600"),
        ({"colour": "red"}, "unknown keys: colour"),
        ({"name": "bad name!"}, "slug"),
        ({"event": ["Stop"]}, "event is one of"),  # not text: refused, not a TypeError
        ({"type": {"a": 1}}, "type is one of"),
    ],
)
def test_a_bad_handler_is_refused_with_a_clear_error(tmp_path: Path, change: dict[str, Any], message: str) -> None:
    with pytest.raises(CommandError, match=message):
        load(write(tmp_path, [{**command("h", "SessionStart"), **change}]))
    assert not HookHandler.objects.exists()


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({**python("p", "Stop", "block"), "callable": "tests.agents.hook_handlers.missing"}, "cannot import"),
        (python("p", "Stop", "not_callable"), "is not callable"),
        ({**webhook("w", "Stop", "ftp://x.example/hook")}, "url is an http:// or https:// URL"),
    ],
)
def test_targets_are_checked_at_load(tmp_path: Path, entry: dict[str, Any], message: str) -> None:
    with pytest.raises(CommandError, match=message):
        load(write(tmp_path, [entry]))


def test_the_file_is_a_list(tmp_path: Path) -> None:
    with pytest.raises(CommandError, match=r"A hooks file holds a list of objects\."):
        load(write(tmp_path, {"hooks": []}))


def test_a_handler_twice_in_one_file_is_refused_and_so_is_the_file(tmp_path: Path) -> None:
    """A handler is named by its brain and its name: loading both entries would keep the last."""
    first, again = command("audit", "Stop", "--print", "a"), command("audit", "SubagentStop", "--print", "b")
    elsewhere = {**command("audit", "Stop", "--print", "c"), "brain": "default"}  # another handler: the brain's

    with pytest.raises(CommandError, match=r"Hook 'audit' is in the file twice\."):
        load(write(tmp_path, [first, elsewhere, again]))
    with pytest.raises(CommandError, match=r"Hook 'audit' of brain 'default' is in the file twice\."):
        load(write(tmp_path, [elsewhere, first, {**elsewhere, "timeout_s": 2}]))
    assert not HookHandler.objects.exists()

    assert load(write(tmp_path, [first, elsewhere])) == "2 hooks created, 0 updated."
