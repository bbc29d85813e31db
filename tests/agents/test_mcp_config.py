"""MCP server rows: loaded with the profiles, never holding a credential, named for function calling."""

import json
import re
import sys
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from agents.mcp.actions import load_mcp_servers
from agents.mcp.connections import open_for, pool
from agents.mcp.models import McpServer
from agents.mcp.runtime import connection_report, is_mcp_call, offered_name
from agents.models import AgentProfile
from agents.tools import TOOLS
from tests.agents.test_mcp import SERVER as TOOLS_SERVER

pytestmark = pytest.mark.django_db

SERVER = {"name": "files", "transport": "stdio", "command": "files-mcp", "env": {"TOKEN": "AGORA_FILES_TOKEN"},
          "allowed_tools": ["read"]}  # fmt: skip
PROFILE = {"name": "coder", "role": "Coder", "model": "m", "tools": ["finish"], "mcp_servers": ["files"]}


def load(path: Path, content: object) -> str:
    path.write_text(json.dumps(content))
    out = StringIO()
    call_command("load_profiles", str(path), stdout=out)
    return out.getvalue().strip()


def test_servers_load_with_the_profiles_and_loading_again_updates_them(tmp_path: Path) -> None:
    path = tmp_path / "brains.json"
    assert load(path, {"mcp_servers": [SERVER], "profiles": [PROFILE]}) == (
        "1 profiles created, 0 updated.\n1 MCP servers created, 0 updated."
    )
    assert load(path, {"mcp_servers": [{**SERVER, "call_timeout_s": 5}], "profiles": [PROFILE]}) == (
        "0 profiles created, 1 updated.\n0 MCP servers created, 1 updated."
    )
    server = McpServer.objects.get()
    assert (server.call_timeout_s, server.allows("read"), server.allows("write")) == (5, True, False)
    assert AgentProfile.objects.get().mcp_servers == ["files"]
    assert load(path, [PROFILE]) == "0 profiles created, 1 updated."  # the plain list still works


@pytest.mark.parametrize(
    "bad",
    [
        {"headers": {"Authorization": "Bearer sk-live-123"}},  # a credential in clear
        {"env": {"TOKEN": "sk-live-123"}},  # a value where a variable name belongs
        {"name": "my_files"},  # an underscore would make `<server>__<tool>` ambiguous
        {"transport": "http"},  # no URL
        {"connect_timeout_s": "soon"},  # not a number: refused, not a TypeError in the model's check
        {"call_timeout_s": None},
    ],
)
def test_a_bad_server_is_refused_and_nothing_is_loaded(tmp_path: Path, bad: dict[str, object]) -> None:
    with pytest.raises(CommandError):
        load(tmp_path / "brains.json", {"mcp_servers": [{**SERVER, **bad}], "profiles": [PROFILE]})
    assert not McpServer.objects.exists() and not AgentProfile.objects.exists()


def test_a_server_named_twice_in_one_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="'files' is in the file twice"):
        load(tmp_path / "brains.json", {"mcp_servers": [SERVER, {**SERVER, "call_timeout_s": 9}], "profiles": []})
    assert not McpServer.objects.exists()


def test_credentials_come_from_the_environment_at_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    server = McpServer(name="x", transport="http", url="http://h/mcp", headers={"Authorization": "Bearer ${T}"},
                       env={"CHILD": "PARENT"})  # fmt: skip
    monkeypatch.setenv("T", "abc")
    monkeypatch.setenv("PARENT", "xyz")
    assert server.resolved_headers() == {"Authorization": "Bearer abc"}
    assert server.child_env() == {"CHILD": "xyz"}


def test_offered_names_are_valid_function_names_that_never_clash_with_built_in_tools() -> None:
    for tool in ("read", "files.read", "a/b c", "x" * 80):
        name = offered_name("files", tool)
        assert re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name) and name.startswith("files__")
        assert is_mcp_call(name)
    assert not any(is_mcp_call(name) for name in TOOLS)


def test_the_connection_report_says_which_servers_connected_with_which_tools_and_why_others_did_not() -> None:
    load_mcp_servers(
        entries=[
            {"name": "tools", "transport": "stdio", "command": sys.executable, "args": [TOOLS_SERVER],
             "allowed_tools": ["echo", "add"]},
            {"name": "broken", "transport": "stdio", "command": "/nonexistent/mcp-server", "allowed_tools": ["*"]},
            {"name": "off", "transport": "stdio", "command": sys.executable, "allowed_tools": ["*"], "enabled": False},
        ]
    )  # fmt: skip
    try:
        report = connection_report("run-report", ["tools", "broken", "off", "missing"])
        assert report["tools"] == {"status": "connected", "tools": ["tools__echo", "tools__add"]}
        assert report["broken"]["status"] == "failed" and "mcp-server" in report["broken"]["reason"]
        assert report["off"] == report["missing"] == {"status": "failed", "reason": "no such enabled MCP server",
                                                      "tools": []}  # fmt: skip
        assert open_for("run-report")
    finally:
        pool().close_run("run-report")
    assert not open_for("run-report")
