"""The production commands (config/production.py): the README shows exactly them, settings refuse to
write into the checkout, and on PostgreSQL a deployment made of exactly those commands answers."""

import os
import re
import secrets
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from django.db import connection

from config import production
from tests.sagas.api_http import Http
from tests.support import BASE_DIR, free_port, shared_database_url, stop_process, wait_until

README_BLOCK = re.compile(r"<!-- python -m config\.production -->\n```sh\n(.*?)```", re.S)


def test_the_readme_shows_exactly_the_production_commands() -> None:
    readme = (BASE_DIR / "README.md").read_text()
    match = README_BLOCK.search(readme)
    assert match, "the README's production section lost its commands block"
    assert match.group(1) == production.render()


def test_with_debug_off_settings_refuse_to_write_into_the_checkout_without_a_data_dir() -> None:
    env = {k: v for k, v in os.environ.items() if k != "AGORA_DATA_DIR"}
    env.update(DEBUG="0", SECRET_KEY="x" * 50, DJANGO_SETTINGS_MODULE="config.settings")
    started = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"], cwd=BASE_DIR, env=env, capture_output=True, text=True
    )
    assert started.returncode != 0
    assert "AGORA_DATA_DIR must be set when DEBUG is off" in started.stderr


@pytest.fixture
def fresh_database() -> Iterator[str]:
    """An empty database on the test's PostgreSQL server: the deployment migrates it from nothing."""
    server = urlsplit(shared_database_url())
    name = f"agora_deploy_{uuid.uuid4().hex[:10]}"
    admin = urlunsplit((server.scheme, server.netloc, "/postgres", "", ""))
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield urlunsplit((server.scheme, server.netloc, f"/{name}", "", ""))
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def data_dir() -> Iterator[Path]:
    """A data dir of this test's own (not under pytest's shared base temp, which other runs prune)."""
    with tempfile.TemporaryDirectory(prefix="agora-deploy-") as path:
        yield Path(path)


@pytest.mark.postgres
@pytest.mark.integration
@pytest.mark.skipif(connection.vendor != "postgresql", reason="deploys on PostgreSQL, as production runs")
def test_a_deployment_from_exactly_the_production_commands_answers_a_round_trip(
    fresh_database: str, redis_url: str, data_dir: Path, artifacts: Path
) -> None:
    port = free_port()
    before = sorted(BASE_DIR.glob("celerybeat-schedule*"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_", "REDIS_", "AGORA_", "WORKER_"))}
    env.update(
        DEBUG="0", SECRET_KEY=secrets.token_urlsafe(50), ALLOWED_HOSTS="127.0.0.1",
        AGORA_DATA_DIR=str(data_dir), DATABASE_URL=fresh_database, REDIS_URL=redis_url,
        DJANGO_SUPERUSER_USERNAME="ops", DJANGO_SUPERUSER_PASSWORD="ops-password-1",
        DJANGO_SUPERUSER_EMAIL="ops@example.com", WEB_HOST="127.0.0.1", WEB_PORT=str(port), WORKER_NAME="w1",
        WORKER_CONCURRENCY="1", PYTHONUNBUFFERED="1", PROMETHEUS_MULTIPROC_DIR=str(data_dir / "metrics"),
        AGORA_METRICS_TOKEN="scrape-token",
    )  # fmt: skip
    for step in production.STEPS + production.HOST_STEPS:
        done = subprocess.run(
            production.argv(step.name, env), cwd=BASE_DIR, env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, f"{step.name}: {done.stdout}{done.stderr}"

    services: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for service in production.SERVICES:
            with (artifacts / f"{service.name}.log").open("wb") as log:
                services[service.name] = subprocess.Popen(
                    production.argv(service.name, env), cwd=BASE_DIR, env=env, stdout=log,
                    stderr=subprocess.STDOUT, start_new_session=True,
                )  # fmt: skip
        web = Http(f"http://127.0.0.1:{port}")

        def healthy() -> bool:
            for name, proc in services.items():
                assert proc.poll() is None, f"{name} exited: {(artifacts / f'{name}.log').read_text()}"
            try:
                return web.get("/healthz").status == 200
            except OSError:
                return False

        wait_until(healthy, timeout=90, interval=0.3, what="/healthz to answer 200")

        token = web.post("/api/v1/auth/token/", {"username": "ops", "password": "ops-password-1"}).ok(200)["token"]
        ops = Http(web.base_url, token, scheme="Token")
        saga = ops.post("/api/v1/sagas/", {"title": "Deployed", "goal": "One round trip"}).ok(201)
        collaborators = f"/api/v1/sagas/{saga['id']}/collaborators/"
        client = ops.post(collaborators, {"kind": "agent", "name": "client", "role": "Client", "task": "Ask",
                                          "runtime": "external"}).ok(201)  # fmt: skip
        ops.post(collaborators, {"kind": "agent", "name": "responder", "role": "Responder", "task": "Answer",
                                 "runtime": "internal", "profile": "responder"}).ok(201)  # fmt: skip
        answered = (
            Http(web.base_url, client["token"])
            .post(
                f"/api/v1/sagas/{saga['id']}/requests/",
                {"to": "agent:responder", "type": "echo.me", "payload": {"n": 1}, "mode": "wait", "timeout_s": 60},
                headers={"Idempotency-Key": "deploy-1"},
            )
            .ok(200)
        )
        assert answered["status"] == "completed" and answered["from"] == "agent:responder"
        # The client reads its steering past the reply: the round trip ends, in the web process.
        agent = Http(web.base_url, client["token"])
        last = agent.get("/api/v1/steering/").ok(200)["items"][-1]["seq"]
        agent.get(f"/api/v1/steering/?after={last}").ok(200)
        scraped = Http(web.base_url, "scrape-token").get("/metrics").ok(200)
        assert 'agora_round_trip_seconds_count{status="completed"} 1.0' in scraped  # counted by daphne
        assert 'agora_turns_total{outcome="idle"}' in scraped  # by the worker's pool process
        run = ops.get(f"/api/v1/runs/{answered_run(ops, collaborators)}/status/").ok(200)
        assert run["worker"].startswith("w1@")  # the node name the worker command gave it
    finally:
        for proc in services.values():
            stop_process(proc)
    assert list(data_dir.glob("celerybeat-schedule*"))  # beat wrote its schedule into the data dir
    assert sorted(BASE_DIR.glob("celerybeat-schedule*")) == before  # and nothing into the checkout


def answered_run(ops: Http, collaborators: str) -> str:
    listed = ops.get(collaborators).ok(200)
    cards = listed["collaborators"] if isinstance(listed, dict) else listed
    return str(next(c["run_id"] for c in cards if c["id"] == "agent:responder"))
