"""The web server refuses a body over AGORA_MAX_BODY_BYTES before it reads it (config/web_request.py): a
Content-Length declared over it, or a chunked body once it passes it, is answered 413 at once and
the connection closed; before, anyone could make daphne write gigabytes to a temporary file, and
then Django copy them again, before the app refused them."""

import json
import socket
import time
import uuid
from pathlib import Path

import pytest
from django.conf import settings

from accounts.actions import issue_token
from accounts.models import User
from sagas import actions
from tests.sagas.api_http import Http
from tests.support import WebServer

pytestmark = pytest.mark.integration

TEN_GB = 10 * 1024**3


def exchange(server: WebServer, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send `request` and read the answer up to the end of the connection: the status, the headers
    by lower-case name, the body. A server still waiting for the rest of the body fails the test."""
    received = b""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(request)
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except TimeoutError:
            pytest.fail(f"no answer, and the connection still open, after 10 s (received {received!r})")
    head, _, body = received.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {name.strip().lower(): value.strip() for name, value in (line.split(":", 1) for line in lines)}
    return int(status_line.split()[1]), headers, body


def post(path: str, *headers: str) -> bytes:
    return "\r\n".join([f"POST {path} HTTP/1.1", "Host: 127.0.0.1", *headers, "", ""]).encode()


def test_a_body_declared_over_the_limit_is_answered_413_before_it_is_sent(web_server: WebServer) -> None:
    api_path = f"/api/v1/sagas/{uuid.uuid4()}/artifacts/"  # no credentials either: refused before anyone is known
    form = "Content-Type: multipart/form-data; boundary=b0undary"

    status, headers, body = exchange(web_server, post(api_path, form, f"Content-Length: {TEN_GB}") + b"--b0undary")

    assert (status, headers["content-type"], headers["connection"]) == (413, "application/problem+json", "close")
    assert json.loads(body) == {
        "type": "about:blank", "title": "Payload too large", "status": 413, "code": "payload_too_large",
        "detail": f"Limit is {settings.AGORA_MAX_BODY_BYTES} bytes for a request body.",
    }  # fmt: skip

    page_path = f"/sagas/{uuid.uuid4()}/artifacts/"
    status, headers, body = exchange(web_server, post(page_path, form, f"Content-Length: {TEN_GB}") + b"--b0undary")

    assert (status, headers["content-type"], headers["connection"]) == (413, "text/plain; charset=utf-8", "close")
    assert body.decode() == f"payload_too_large: Limit is {settings.AGORA_MAX_BODY_BYTES} bytes for a request body."


def test_a_chunked_body_is_cut_off_as_it_passes_the_limit(web_server: WebServer) -> None:
    limit = settings.AGORA_MAX_BODY_BYTES
    chunked = post("/api/v1/sagas/", "Content-Type: application/json", "Transfer-Encoding: chunked")
    # The limit's worth in one chunk, then one byte more (and no end: the server must not wait for it).
    past = chunked + b"%x\r\n" % limit + b" " * limit + b"\r\n1\r\n "

    status, headers, body = exchange(web_server, past)

    assert (status, headers["connection"], json.loads(body)["code"]) == (413, "close", "payload_too_large")

    within = post("/api/v1/sagas/", "Content-Type: application/json", "Transfer-Encoding: chunked", "Connection: close")
    status, _, body = exchange(web_server, within + b"2\r\n{}\r\n0\r\n\r\n")
    assert (status, json.loads(body)["code"]) == (411, "length_required")  # the app's own answer: it was passed on


def test_the_largest_artifact_still_goes_through_the_server(web_server: WebServer, alice: User) -> None:
    saga = actions.create_saga(title="Uploads", owner=alice)
    web = Http(web_server.url, issue_token(user=alice), scheme="Token")
    content = b"x" * settings.AGORA_MAX_ARTIFACT_BYTES
    upload = (
        b'--b0undary\r\nContent-Disposition: form-data; name="file"; filename="big.bin"\r\n'
        b"Content-Type: application/octet-stream\r\n\r\n" + content + b"\r\n--b0undary--\r\n"
    )
    form = {"Content-Type": "multipart/form-data; boundary=b0undary"}

    added = web.call("POST", f"/api/v1/sagas/{saga.pk}/artifacts/", raw=upload, headers=form).ok(201)

    assert (added["name"], added["size"]) == ("big.bin", settings.AGORA_MAX_ARTIFACT_BYTES)
    # A file a little over the limit (its framing past it too) reaches the app, which says why.
    over = upload.replace(b"big.bin", b"over.bin").replace(
        content, content + b"x" * 2 * settings.AGORA_UPLOAD_FRAMING_BYTES
    )
    refused = web.call("POST", f"/api/v1/sagas/{saga.pk}/artifacts/", raw=over, headers=form)
    assert refused.problem(413, "payload_too_large")["detail"] == "This upload is over the artifact size limit."


def test_the_gateways_are_answered_as_the_api_is(web_server: WebServer) -> None:
    """The A2A and MCP endpoints' clients read problem+json, as the gateways' own refusals are."""
    for path in (f"/a2a/{uuid.uuid4()}/ext/", "/mcp"):
        status, headers, body = exchange(web_server, post(path, "Content-Type: application/json",
                                                          f"Content-Length: {TEN_GB}"))  # fmt: skip
        assert (status, headers["content-type"], json.loads(body)["code"]) == (
            413, "application/problem+json", "payload_too_large"
        )  # fmt: skip


def test_a_client_that_sends_its_whole_body_first_still_reads_the_413(web_server: WebServer) -> None:
    """Most HTTP clients send the whole body before they read the answer: the server reads the rest
    and drops it (a lingering close), so that the client's sending ends and the 413 is there to
    read, where closing at once with the body unread resets the connection under it."""
    over = settings.AGORA_MAX_BODY_BYTES + 4 * 1024**2
    for path in ("/api/v1/sagas/", f"/sagas/{uuid.uuid4()}/artifacts/"):
        request = post(path, "Content-Type: application/octet-stream", f"Content-Length: {over}")
        status, headers, _ = exchange(web_server, request + b"x" * over)
        assert (status, headers["connection"]) == (413, "close"), path


@pytest.mark.django_db(transaction=True)
def test_a_refused_body_is_read_and_dropped_for_a_bounded_time_only(redis_url: str, artifacts: Path) -> None:
    """A client that goes on sending after the 413 is read from for AGORA_BODY_LINGER_S at most,
    then cut off: nobody holds a connection open by never ending a refused body."""
    server = WebServer(redis_url, artifacts, env={"AGORA_BODY_LINGER_S": "0.5"})
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            began = time.monotonic()  # before the request: the server begins lingering after it
            sock.sendall(post("/api/v1/sagas/", "Content-Type: application/octet-stream", f"Content-Length: {TEN_GB}"))
            answer = b""
            while chunk := sock.recv(65536):  # the answer, then the end of the server's half
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 413 ")
            with pytest.raises((ConnectionResetError, BrokenPipeError)):  # once the server stops reading
                while time.monotonic() < began + 30:
                    sock.sendall(b"x" * 65536)
            assert time.monotonic() - began >= 0.5  # it was read from and dropped until then
    finally:
        server.stop()
