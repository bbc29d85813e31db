import json
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.test import Client

from agents.actions import load_profiles
from agents.models import AgentProfile

pytestmark = pytest.mark.django_db

PROFILE = {
    "name": "coder",
    "role": "Coder",
    "system_prompt": "You implement API changes.",
    "tools": ["get_collaborators", "ask_agent", "reply", "ask_human", "delegate", "finish"],
    "model": "gpt-4.1-mini",
    "fallback_models": ["gpt-4.1-nano"],
    "endpoint": "default",
    "requires": [],
    "resumable": False,
    "max_turns": 40,
}


def load(path: Path) -> str:
    out = StringIO()
    call_command("load_profiles", str(path), stdout=out)
    return out.getvalue().strip()


def test_loading_json_creates_and_loading_again_updates_in_place(tmp_path: Path) -> None:
    path = tmp_path / "profiles.json"
    path.write_text(json.dumps([PROFILE]))
    assert load(path) == "1 profiles created, 0 updated."

    path.write_text(json.dumps([{**PROFILE, "fallback_models": ["gpt-4.1-nano", "local-llama"], "max_turns": 12}]))
    assert load(path) == "0 profiles created, 1 updated."

    profile = AgentProfile.objects.get(name="coder")
    assert profile.candidates == ["gpt-4.1-mini", "gpt-4.1-nano", "local-llama"]
    assert profile.max_turns == 12
    assert AgentProfile.objects.count() == 1


def test_loading_yaml(tmp_path: Path) -> None:
    path = tmp_path / "profiles.yaml"
    path.write_text("- name: tester\n  role: Tester\n  model: scripted:responder\n  tools: [reply]\n")
    assert load(path) == "1 profiles created, 0 updated."
    assert AgentProfile.objects.get(name="tester").tools == ["reply"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "Expecting property name"),
        (json.dumps({"name": "x"}), "A profiles file holds a list of objects."),
        (json.dumps([{"name": "x", "role": "X"}]), "lacks model"),
        (json.dumps([{**PROFILE, "colour": "red"}]), "unknown keys: colour"),
        (json.dumps([PROFILE, {**PROFILE, "name": "bad name!"}]), "slug"),
        # Each key's type, before the model turns a list into its repr or a string into its letters.
        (json.dumps([{**PROFILE, "role": ["Coder"]}]), "wrong type for role "),
        (
            json.dumps([{**PROFILE, "tools": "finish", "fallback_models": "gpt-4.1-nano"}]),
            "wrong type for fallback_models, tools ",
        ),
        (json.dumps([{**PROFILE, "model_capabilities": ["vision"]}]), "wrong type for model_capabilities "),
        (json.dumps([{**PROFILE, "max_turns": True}]), "wrong type for max_turns "),
        (json.dumps([PROFILE, {**PROFILE, "role": "Other"}]), "'coder' is in the file twice"),
        (json.dumps([PROFILE]).replace("40", "NaN"), "NaN is not a JSON number"),
        ("[" * 100_000 + "]" * 100_000, "nests deeper than"),
    ],
)
def test_a_bad_file_is_refused_whole_with_a_clear_error(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "profiles.json"
    path.write_text(content)
    with pytest.raises(CommandError, match=message):
        load(path)
    assert not AgentProfile.objects.exists()  # all or nothing


def test_a_yaml_key_that_is_not_text_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "profiles.yaml"
    path.write_text("- {name: coder, role: Coder, model: m, 1: x}\n")
    with pytest.raises(CommandError, match="Keys are text: 1 is not"):
        load(path)
    assert not AgentProfile.objects.exists()


def test_the_shipped_profiles_load(tmp_path: Path) -> None:
    shipped = Path(__file__).resolve().parents[2] / "agents" / "profiles" / "default.json"
    assert load(shipped).startswith(f"{len(json.loads(shipped.read_text()))} profiles created")
    assistant = AgentProfile.objects.get(name="assistant")
    assert assistant.candidates == ["gpt-4.1-mini", "gpt-4.1-nano"]


def test_seed_demo_without_its_owner_says_so_and_loads_nothing() -> None:
    with pytest.raises(CommandError, match="ensure_demo_user"):
        call_command("seed_demo", stdout=StringIO())
    assert not AgentProfile.objects.exists()


@pytest.mark.parametrize(
    ("field", "value"),
    [("model_capabilities", "[]"), ("tools", '"finish"'), ("fallback_models", '"gpt-4.1-nano"')],
)
def test_the_admin_refuses_a_profile_of_the_wrong_types_as_the_loader_does(
    admin_client: Client, field: str, value: str
) -> None:
    """A map given a list failed every turn of its agents (each reclaimed, for ever); text for a
    list made each letter a tool or a fallback model."""
    load_profiles(entries=[PROFILE])
    profile = AgentProfile.objects.get(name=PROFILE["name"])
    form: dict[str, object] = {
        name: json.dumps(getattr(profile, name))
        for name in ("tools", "fallback_models", "model_capabilities", "requires", "mcp_servers")
    }
    form.update(name=profile.name, role=profile.role, model=profile.model, max_turns=profile.max_turns,
                max_tokens=profile.max_tokens, endpoint=profile.endpoint, system_prompt="")  # fmt: skip

    saved = admin_client.post(f"/admin/agents/agentprofile/{profile.pk}/change/", {**form, field: value})

    assert saved.status_code == 200 and "names and model ids are text" in saved.content.decode()
    assert getattr(AgentProfile.objects.get(pk=profile.pk), field) == getattr(profile, field)
    assert admin_client.post(f"/admin/agents/agentprofile/{profile.pk}/change/", form).status_code == 302
