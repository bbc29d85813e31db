"""Brains as configuration: `load_brains` from a YAML file creates them and, loaded again, updates
the same rows; the admin refuses the brains the loader refuses (a signal that does not compile, a
profile that does not exist, ...), with the same checks, and saves a good edit."""

import json
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.test import Client

from agents.actions import load_profiles
from agents.orchestrator.models import Brain
from agents.orchestrator.plans import Routing, heuristic_plan

pytestmark = pytest.mark.django_db

BRAINS_YAML = r"""
- name: web
  description: Web work.
  planner_profile: b-router
  roles: {coder: b-coder, tester: b-tester, review: b-review}
  signals:
    coder: [implement, '\bapi\b']
    tester: ['\btests?\b']
  default_primary: coder
  max_parallel_agents: 2
- name: docs
  planner_profile: b-router
  roles: {writer: b-writer}
  default_primary: writer
  review_role: ""
"""

EDITED_YAML = r"""
- name: web
  description: Web work, reviewed by hand.
  planner_profile: b-coder
  roles: {coder: b-coder, tester: b-tester, writer: b-writer, review: b-review}
  signals:
    coder: [implement]
    writer: ['\bchangelog\b']
  default_primary: tester
  max_parallel_agents: 3
  review_policy: changes_requested
- name: docs
  planner_profile: b-router
  roles: {writer: b-writer}
  default_primary: writer
  review_role: ""
  review_by_default: false
"""

GOOD: dict[str, Any] = {
    "name": "web", "description": "", "planner_profile": "b-router",
    "roles": {"coder": "b-coder", "tester": "b-tester", "review": "b-review"},
    "signals": {"coder": ["implement"], "tester": [r"\btests?\b"]}, "default_primary": "coder",
}  # fmt: skip


@pytest.fixture(autouse=True)
def profiles(db: None) -> None:
    load_profiles(
        entries=[
            {"name": f"b-{role}", "role": role.title(), "model": f"{role}-m", "tools": ["finish"]}
            for role in ("router", "coder", "tester", "writer", "review")
        ]
    )


def load(path: Path) -> str:
    out = StringIO()
    call_command("load_brains", str(path), stdout=out)
    return out.getvalue().strip()


def test_a_yaml_file_creates_brains_and_loading_it_edited_updates_the_same_rows(tmp_path: Path) -> None:
    path = tmp_path / "brains.yaml"
    path.write_text(BRAINS_YAML)

    assert load(path) == "2 brains created, 0 updated."

    web, docs = Brain.objects.get(name="web"), Brain.objects.get(name="docs")
    assert web.signals == {"coder": ["implement", r"\bapi\b"], "tester": [r"\btests?\b"]}
    assert (web.roles, web.max_parallel_agents, web.review_policy) == (
        {"coder": "b-coder", "tester": "b-tester", "review": "b-review"}, 2, "blocked"
    )  # fmt: skip
    assert (docs.review_role, docs.review_by_default) == ("", True)

    path.write_text(EDITED_YAML)
    assert load(path) == "0 brains created, 2 updated."

    assert Brain.objects.count() == 2
    edited = Brain.objects.get(name="web")
    assert edited.pk == web.pk and Brain.objects.get(name="docs").pk == docs.pk
    assert (edited.description, edited.planner_profile, edited.default_primary) == (
        "Web work, reviewed by hand.", "b-coder", "tester"
    )  # fmt: skip
    assert edited.roles == {"coder": "b-coder", "tester": "b-tester", "writer": "b-writer", "review": "b-review"}
    assert edited.signals == {"coder": ["implement"], "writer": [r"\bchangelog\b"]}
    assert (edited.max_parallel_agents, edited.review_policy) == (3, "changes_requested")
    assert Brain.objects.get(name="docs").review_by_default is False
    # Loaded again unchanged, nothing is created either.
    assert load(path) == "0 brains created, 2 updated." and Brain.objects.count() == 2


def test_a_brain_named_twice_in_one_file_is_refused_whole(tmp_path: Path) -> None:
    path = tmp_path / "brains.json"
    path.write_text(json.dumps([GOOD, {**GOOD, "max_parallel_agents": 1}]))
    with pytest.raises(CommandError, match=f"{GOOD['name']!r} is in the file twice"):
        load(path)
    assert not Brain.objects.exists()


# Each: an edit that would break routing or delegation, and the field it is refused on.
BAD_EDITS = [
    pytest.param({"signals": {"tester": ["(unclosed"]}}, "signals", id="a signal that does not compile"),
    # `re` reads it (as a set of characters, with a warning); `regex`, which matches the signals, does not.
    pytest.param({"signals": {"tester": ["[[:foo:]]"]}}, "signals", id="a signal that regex does not compile"),
    pytest.param({"signals": {"designer": ["css"]}}, "signals", id="signals of no role"),
    pytest.param({"roles": {**GOOD["roles"], "writer": "b-nobody"}}, "roles", id="a role on no profile"),
    pytest.param({"roles": {**GOOD["roles"], "primary": "b-writer"}}, "roles", id="a role on a reserved name"),
    pytest.param({"roles": ["b-coder"]}, "roles", id="roles not a mapping"),
    pytest.param({"planner_profile": "b-nobody"}, "planner_profile", id="a planner on no profile"),
    pytest.param({"default_primary": "writer"}, "default_primary", id="a default primary of no role"),
]


def admin_form(brain: dict[str, Any]) -> dict[str, Any]:
    """The admin's change form as a browser posts it."""
    form = {
        "name": brain["name"], "description": brain.get("description", ""),
        "planner_profile": brain["planner_profile"], "roles": json.dumps(brain["roles"]),
        "signals": json.dumps(brain.get("signals", {})), "default_primary": brain["default_primary"],
        "review_role": brain.get("review_role", "review"), "max_parallel_agents": brain.get("max_parallel_agents", 3),
        "review_policy": brain.get("review_policy", "blocked"), "_save": "Save",
    }  # fmt: skip
    if brain.get("review_by_default", True):
        form["review_by_default"] = "on"
    return form


def stored(name: str) -> dict[str, Any]:
    return dict(Brain.objects.filter(name=name).values().get())


@pytest.mark.parametrize(("change", "field"), BAD_EDITS)
def test_the_admin_refuses_what_the_loader_refuses_and_changes_nothing(
    admin_client: Client, tmp_path: Path, change: dict[str, Any], field: str
) -> None:
    path = tmp_path / "brains.json"
    path.write_text(json.dumps([GOOD]))
    load(path)
    before = stored("web")
    url = f"/admin/agents/brain/{before['id']}/change/"

    response = admin_client.post(url, admin_form({**GOOD, **change}))

    assert response.status_code == 200  # the form again, not the redirect of a save
    errors = response.context["adminform"].form.errors
    assert list(errors) == [field], errors
    assert "Please correct the error below." in response.content.decode()
    assert stored("web") == before
    # The loader refuses the same brain, on the same field.
    path.write_text(json.dumps([{**GOOD, **change}]))
    with pytest.raises(CommandError, match=rf"Brain 'web': {field}: "):
        load(path)
    assert stored("web") == before


def test_the_admin_adds_no_brain_whose_signals_do_not_compile(admin_client: Client) -> None:
    bad = {**GOOD, "name": "new", "signals": {"coder": ["[a-"]}}

    response = admin_client.post("/admin/agents/brain/add/", admin_form(bad))

    assert response.status_code == 200 and "signals" in response.context["adminform"].form.errors
    assert not Brain.objects.filter(name="new").exists()


def test_a_good_edit_in_the_admin_is_saved_and_routes(admin_client: Client, tmp_path: Path) -> None:
    path = tmp_path / "brains.json"
    path.write_text(json.dumps([GOOD]))
    load(path)
    before = stored("web")
    edit = {
        **GOOD,
        "roles": {**GOOD["roles"], "writer": "b-writer"},
        "signals": {"coder": ["implement"], "writer": [r"\bchangelog\b"]},
        "default_primary": "writer",
        "max_parallel_agents": 1,
    }

    response = admin_client.post(f"/admin/agents/brain/{before['id']}/change/", admin_form(edit))

    assert response.status_code == 302, response.context["adminform"].form.errors
    brain = Brain.objects.get(pk=before["id"])
    assert (brain.roles, brain.signals, brain.default_primary, brain.max_parallel_agents) == (
        edit["roles"], edit["signals"], "writer", 1
    )  # fmt: skip
    plan = heuristic_plan("Implement it, with a changelog entry.", Routing.of(brain))
    assert plan["primary_role"] == "coder" and [w["role"] for w in plan["workers"]] == ["writer"]
