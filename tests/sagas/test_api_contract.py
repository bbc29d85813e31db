"""The API contract a client generator reads: schemathesis against the live app from the served
OpenAPI schema, with every check it has, and a typed client generated from that schema completing
an ask/reply round trip."""

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from accounts.actions import issue_token
from accounts.models import User
from sagas import actions
from tests.support import WebServer

pytestmark = pytest.mark.integration
BIN = Path(sys.executable).parent


@pytest.fixture
def live_app(
    transactional_db: None, redis_url: str, artifacts: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[WebServer]:
    """The real app under daphne, with waits cut short: the fuzzer asks for long-polls and waits."""
    monkeypatch.setenv("AGORA_STEERING_POLL_MAX_S", "0.3")
    monkeypatch.setenv("AGORA_MAX_WAIT_S", "0.3")
    # The fuzzer sends as fast as the app answers: the agents' request quota (a 429 that depends on
    # timing, tested in tests/accounts/test_throttles.py) is not what it checks.
    monkeypatch.setenv("AGORA_AGENT_RATE", "100000/s")
    server = WebServer(redis_url, artifacts)
    yield server
    server.stop()


@pytest.mark.timeout(300)  # about 40 s on a quiet machine; a loaded one can take a few times that
def test_schemathesis_finds_no_server_error_and_no_schema_violation(
    live_app: WebServer, alice: User, bob: User, artifacts: Path
) -> None:
    web_server = live_app
    saga = actions.create_saga(title="Contract", goal="Fuzz it", owner=alice)
    actions.add_human(saga=saga, user=bob, role="Analyst", task="Read", by=alice)
    ext, agent_token = actions.add_agent(saga=saga, name="ext", role="Client", task="Ask", runtime="external", by=alice)
    other, _ = actions.add_agent(saga=saga, name="other", role="Peer", task="Answer", runtime="external", by=alice)
    assert agent_token is not None
    request, _ = actions.ask_agent(sender=other, to="agent:ext", type="task.do", payload={"n": 1})
    actions.ask_agent(sender=ext, to="agent:other", type="task.ask", payload={"n": 2})
    config = artifacts / "schemathesis.toml"
    config.write_text(
        f'[auth.openapi.personToken]\napi_key = "Token {issue_token(user=alice)}"\n\n'
        f'[auth.openapi.agentToken]\nbearer = "{agent_token}"\n\n'
        # Two answers no schema of a body can foresee, kept to their operations: an agent's profile
        # and delegator are named by reference, and one that does not exist is invalid_payload;
        # a wrong username or password is invalid_credentials. Both are 400.
        '[[operations]]\ninclude-operation-id = "collaborators_create"\n'
        'checks.positive_data_acceptance.expected-statuses = ["2xx", "400", "401", "403", "404", "409"]\n\n'
        '[[operations]]\ninclude-operation-id = "auth_token_create"\n'
        'checks.positive_data_acceptance.expected-statuses = ["2xx", "400", "429"]\n'
        # Likewise named by reference or checked by the kernel alone: a request's recipient (unknown,
        # or the asker itself), a prompt's brain, a form's fields (per-field errors, unique names),
        # an artifact's file part, which no generated string fills, and a remote agent's URL (a
        # real http(s) URL, once per saga).
        + "".join(
            f'\n[[operations]]\ninclude-operation-id = "{operation}"\n'
            'checks.positive_data_acceptance.expected-statuses = ["2xx", "400", "401", "403", "404", "409"]\n'
            for operation in (
                "requests_create",
                "prompts_create",
                "human_requests_create",
                "artifacts_create",
                "remote_agents_create",
            )
        )
        # A saga the fuzzer finished (sagas_finish, with the other status next: 409) refuses new
        # work with saga_finished (409), whatever the body; a prompt it cancelled, a second cancel
        # (invalid_state, 409).
        + "".join(
            f'\n[[operations]]\ninclude-operation-id = "{operation}"\n'
            'checks.positive_data_acceptance.expected-statuses = ["2xx", "400", "401", "403", "404", "409"]\n'
            for operation in ("sagas_finish", "collaborators_steer", "teams_spawn", "teams_broadcast", "prompts_cancel")
        )
        # A steering cursor is checked against the agent's own items: one past its newest (any
        # integer the schema allows may be) is invalid_payload (400).
        + '\n[[operations]]\ninclude-operation-id = "steering_list"\n'
        'checks.positive_data_acceptance.expected-statuses = ["2xx", "400", "401", "403", "429"]\n'
    )
    ran = subprocess.run(
        [
            str(BIN / "schemathesis"), "--config-file", str(config), "run", f"{web_server.url}/api/v1/schema/",
            "--url", web_server.url, "--checks", "all", "--phases", "examples,coverage,fuzzing,stateful",
            "--max-examples", "3", "--seed", "1", "--workers", "1", "--generation-deterministic",
            # Strings the database cannot store (NUL, lone surrogates) are refused at every edge
            # before any schema applies; tests/sagas/test_unstorable_input.py covers that refusal.
            "--generation-allow-x00", "false", "--generation-codec", "utf-8",
            "--suppress-health-check", "all", "--request-timeout", "10", "--report", "ndjson",
            "--report-dir", str(artifacts / "schemathesis"),
        ],
        cwd=artifacts, capture_output=True, text=True, timeout=280,  # its cache, out of the checkout
    )  # fmt: skip
    (artifacts / "schemathesis.log").write_text(ran.stdout + ran.stderr)
    assert ran.returncode == 0, ran.stdout[-6000:] + ran.stderr[-2000:]
    assert request.pk  # the fixtures existed while it ran


OPENAPI_PYTHON_CLIENT = "openapi-python-client==0.29.1"


def generator_dir() -> Path:
    """openapi-python-client, installed once per machine into a temporary folder of its own (a
    tool of this test only: not one of Agora's requirements, and never committed)."""
    target = Path(tempfile.gettempdir()) / f"agora-{OPENAPI_PYTHON_CLIENT.replace('==', '-')}"
    if not (target / "openapi_python_client").exists():
        staging = Path(tempfile.mkdtemp(prefix="agora-opc-"))
        pip = [sys.executable, "-m", "pip", "install", "--quiet", "--target", str(staging), OPENAPI_PYTHON_CLIENT]
        subprocess.run(pip, check=True, capture_output=True, timeout=170)
        with contextlib.suppress(OSError):  # another test process may have finished first
            staging.rename(target)
    return target


def test_a_client_generated_from_the_served_schema_completes_an_ask_reply_round_trip(
    live_app: WebServer, alice: User, tmp_path: Path, artifacts: Path
) -> None:
    out = Path(tempfile.mkdtemp(prefix="agora-client-"))
    try:
        generated = subprocess.run(
            [sys.executable, "-m", "openapi_python_client", "generate", "--meta", "none",
             "--url", f"{live_app.url}/api/v1/schema/?format=json", "--output-path", str(out / "agora_client")],
            env={**os.environ, "PYTHONPATH": str(generator_dir())}, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        (artifacts / "generate.log").write_text(generated.stdout + generated.stderr)
        assert generated.returncode == 0, generated.stdout + generated.stderr
        sys.path.insert(0, str(out))
        try:
            round_trip(live_app.url)
        finally:
            sys.path.remove(str(out))
            for name in [m for m in sys.modules if m == "agora_client" or m.startswith("agora_client.")]:
                del sys.modules[name]
    finally:
        shutil.rmtree(out, ignore_errors=True)


def round_trip(url: str) -> None:
    """alice signs in, makes a saga with two external agents; one asks, the other replies, the
    asker reads the reply from its steering: every call and every shape from the generated client."""
    from agora_client import AuthenticatedClient, Client
    from agora_client.api.auth import auth_token_create
    from agora_client.api.requests import requests_reply, requests_retrieve
    from agora_client.api.sagas import collaborators_create, requests_create, sagas_create
    from agora_client.api.steering import steering_list
    from agora_client.models import (
        AgentAddInput,
        AgentAddInputKindEnum,
        AskInput,
        AskInputPayloadType0,
        AskPendingOutput,
        ReplyPayloadInput,
        RequestStatusEnum,
        RequestStatusOutput,
        SagaCreateInput,
        SteeringKindEnum,
        TokenCreateInput,
    )

    token = auth_token_create.sync(
        client=Client(url), body=TokenCreateInput(username="alice", password="alice-password")
    )
    alice = AuthenticatedClient(url, token=token.token, prefix="Token")
    saga = sagas_create.sync(client=alice, body=SagaCreateInput(title="Typed", goal="A generated client"))

    def agent(name: str) -> Any:
        added = collaborators_create.sync(
            saga.id, client=alice, body=AgentAddInput(kind=AgentAddInputKindEnum.AGENT, name=name, role=name.title())
        )
        return AuthenticatedClient(url, token=added.token, prefix="Bearer")

    asker, answerer = agent("asker"), agent("answerer")
    asked = requests_create.sync(
        saga.id, client=asker, idempotency_key="typed-1",
        body=AskInput(to="agent:answerer", type_="typed.ask", payload=AskInputPayloadType0.from_dict({"q": 6})),
    )  # fmt: skip
    assert isinstance(asked, AskPendingOutput)
    inbox = steering_list.sync(client=answerer)
    item = next(i for i in inbox.items if i.request_id == asked.request_id)
    assert item.kind == SteeringKindEnum.REQUEST and item.payload == {"q": 6} and item.from_ == "agent:asker"

    replied = requests_reply.sync(asked.request_id, client=answerer, body=ReplyPayloadInput(payload={"a": 42}))
    assert isinstance(replied, RequestStatusOutput) and replied.status == RequestStatusEnum.COMPLETED
    response = next(i for i in steering_list.sync(client=asker).items if i.kind == SteeringKindEnum.RESPONSE)
    assert response.request_id == asked.request_id and response.payload == {"a": 42}
    assert response.status == "completed"
    state = requests_retrieve.sync(asked.request_id, client=asker)
    assert state.status == RequestStatusEnum.COMPLETED
