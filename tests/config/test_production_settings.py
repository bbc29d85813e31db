"""Production settings: the TLS switch makes `check --deploy` clean and does what it says over a
real daphne process, static files come from WhiteNoise, and a crash never shows a traceback."""

import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from django.test import Client

from tests.sagas.api_http import Http
from tests.support import BASE_DIR, WebServer, child_env

PRODUCTION = {"DEBUG": "0", "SECRET_KEY": secrets.token_urlsafe(60), "ALLOWED_HOSTS": "agora.example.org,127.0.0.1"}


def deploy_check(redis_url: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=BASE_DIR, env=child_env(redis_url, **PRODUCTION, **env), capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_check_deploy_is_clean_behind_tls(redis_url: str) -> None:
    clean = deploy_check(redis_url, AGORA_BEHIND_TLS="1")
    assert clean.returncode == 0, clean.stderr


@pytest.mark.django_db(transaction=True)
def test_behind_tls_over_a_real_server(redis_url: str, artifacts: Path) -> None:
    server = WebServer(redis_url, artifacts, env={**PRODUCTION, "AGORA_BEHIND_TLS": "1"})
    try:
        web, https = Http(server.url), {"X-Forwarded-Proto": "https"}
        redirected = web.get("/accounts/login/")
        assert redirected.status == 301 and redirected.headers["location"].startswith("https://")
        page = web.get("/accounts/login/", headers=https)
        assert page.status == 200
        assert page.headers["strict-transport-security"] == "max-age=31536000; includeSubDomains; preload"
        assert "secure" in page.headers["set-cookie"].lower()  # the CSRF cookie
        assert web.get("/healthz").status in (200, 503)  # probes are not redirected
        css = web.get("/static/agora/agora.css", headers=https)
        assert css.status == 200 and css.headers["content-type"].startswith("text/css")
        assert web.get("/static/admin/css/base.css", headers=https).status == 200
        assert web.get("/static/nothing-here.css", headers=https).status == 404
    finally:
        server.stop()


@pytest.mark.urls("tests.config.crash_urls")
def test_a_crash_never_shows_a_traceback(db: None) -> None:
    client = Client(raise_request_exception=False)
    page = client.get("/crash/")
    assert page.status_code == 500 and b"Something went wrong" in page.content
    api = client.get("/api/v1/crash/")
    assert api.status_code == 500 and api.json()["code"] == "server_error"
    for response in (page, api):
        assert b"Traceback" not in response.content and b"secret detail" not in response.content
