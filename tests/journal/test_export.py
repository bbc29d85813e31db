"""JSONL export: `manage.py export_journal SAGA_ID [--after N]` and `GET /api/v1/sagas/<id>/journal.jsonl`."""

import json
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.test import Client

from accounts.actions import issue_token
from accounts.models import User
from journal.actions import record
from journal.models import JournalEvent
from sagas.actions import create_saga
from sagas.models import Saga

pytestmark = pytest.mark.django_db


@pytest.fixture
def journal(saga: Saga, alice: User) -> list[dict[str, Any]]:
    """The saga's whole journal, as exported, after five notes (and a note in another saga)."""
    other = create_saga(title="Other", owner=alice)
    for i in range(5):
        record(saga_id=saga.pk, type="note", actor="human:alice", data={"i": i, "text": "café"})
        record(saga_id=other.pk, type="noise")
    return [event.as_dict() for event in JournalEvent.objects.for_saga(saga.pk)]


def parse(jsonl: str) -> list[dict[str, Any]]:
    assert jsonl.endswith("\n")
    return [json.loads(line) for line in jsonl.splitlines()]


def export(*args: str) -> str:
    out = StringIO()
    call_command("export_journal", *args, stdout=out)
    return out.getvalue()


def test_the_command_writes_the_whole_journal_in_order(saga: Saga, journal: list[dict[str, Any]]) -> None:
    lines = parse(export(str(saga.pk)))

    assert lines == journal
    assert [line["seq"] for line in lines] == list(range(1, len(journal) + 1))
    assert lines[-1]["data"] == {"i": 4, "text": "café"}


def test_the_command_starts_after_the_cursor(saga: Saga, journal: list[dict[str, Any]]) -> None:
    cursor = len(journal) - 2

    assert parse(export(str(saga.pk), "--after", str(cursor))) == journal[cursor:]
    assert export(str(saga.pk), "--after", str(len(journal))) == ""


@pytest.mark.parametrize(
    ("saga_id", "message"),
    [("00000000-0000-4000-8000-000000000000", "No saga"), ("not-a-uuid", "Not a saga id")],
)
def test_the_command_rejects_an_unknown_saga(saga_id: str, message: str) -> None:
    with pytest.raises(CommandError, match=message):
        export(saga_id)


def download(client: Client, saga: Saga, query: str = "", **headers: str) -> Any:
    return client.get(f"/api/v1/sagas/{saga.pk}/journal.jsonl{query}", headers=headers)


def body(response: Any) -> str:
    return b"".join(response.streaming_content).decode()


def test_the_owner_downloads_the_journal(client: Client, alice: User, saga: Saga, journal: list[dict]) -> None:
    client.force_login(alice)

    response = download(client, saga)

    assert response.status_code == 200
    assert response["Content-Type"] == "application/x-ndjson"
    assert response["Content-Disposition"] == f'attachment; filename="saga-{saga.pk}-journal.jsonl"'
    assert parse(body(response)) == journal


def test_the_download_starts_after_the_cursor(client: Client, alice: User, saga: Saga, journal: list[dict]) -> None:
    token = issue_token(user=alice)

    response = download(client, saga, "?after=3", authorization=f"Token {token}")

    assert response.status_code == 200
    assert parse(body(response)) == journal[3:]


@pytest.mark.parametrize("after", ["abc", "-1", "1.5"])
def test_a_bad_cursor_is_a_400_problem(client: Client, alice: User, saga: Saga, after: str) -> None:
    client.force_login(alice)

    response = download(client, saga, f"?after={after}")

    assert response.status_code == 400
    assert response["Content-Type"] == "application/problem+json"
    problem = response.json()
    assert (problem["status"], problem["code"]) == (400, "invalid_payload")
    assert "after" in problem["errors"]


def test_an_outsider_gets_a_404_and_no_data(client: Client, mallory: User, saga: Saga, journal: list[dict]) -> None:
    client.force_login(mallory)

    response = download(client, saga)

    assert response.status_code == 404
    assert response["Content-Type"] == "application/problem+json"
    assert response.json()["code"] == "not_found"
    assert "café" not in response.content.decode()


def test_an_unknown_saga_is_a_404(client: Client, alice: User) -> None:
    client.force_login(alice)

    response = client.get("/api/v1/sagas/00000000-0000-4000-8000-000000000000/journal.jsonl")

    assert response.status_code == 404


def test_anonymous_is_refused_with_no_data(client: Client, saga: Saga, journal: list[dict]) -> None:
    response = download(client, saga)

    assert response.status_code in (401, 403)
    assert response["Content-Type"] == "application/problem+json"
    assert "café" not in response.content.decode()
    assert "note" not in response.content.decode()


@pytest.mark.django_db(transaction=True)
def test_served_over_asgi_the_download_goes_out_batch_by_batch(alice: User, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under an ASGI server (daphne, as Agora runs) Django streams only an async iterator: a sync one
    it reads whole first, so a large journal's first byte waited for its last batch."""
    from asgiref.sync import async_to_sync
    from asgiref.testing import ApplicationCommunicator

    from config.asgi import application
    from journal import export

    saga = create_saga(title="Long", owner=alice)
    for i in range(50 - JournalEvent.objects.filter(saga=saga).count()):
        record(saga_id=saga.pk, type="note", actor="human:alice", data={"i": i})
    monkeypatch.setattr(export, "EXPORT_BATCH", 5)
    reads: list[int] = []
    read_batch = export.jsonl_batch

    def counted(*args: Any, **kwargs: Any) -> Any:
        reads.append(kwargs["after"])
        return read_batch(*args, **kwargs)

    monkeypatch.setattr(export, "jsonl_batch", counted)
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
        "path": f"/api/v1/sagas/{saga.pk}/journal.jsonl", "raw_path": b"", "query_string": b"", "root_path": "",
        "headers": [(b"host", b"localhost"), (b"authorization", f"Token {issue_token(user=alice)}".encode())],
        "client": ("127.0.0.1", 50000), "server": ("localhost", 80),
    }  # fmt: skip

    async def download() -> tuple[int, int, bytes]:
        app = ApplicationCommunicator(application, scope)
        await app.send_input({"type": "http.request", "body": b"", "more_body": False})
        start = await app.receive_output(10)
        chunk = await app.receive_output(10)
        read_by_then, chunks = len(reads), [chunk.get("body", b"")]
        while chunk.get("more_body"):
            chunk = await app.receive_output(10)
            chunks.append(chunk.get("body", b""))
        return start["status"], read_by_then, b"".join(chunks)

    status, read_by_then, content = async_to_sync(download)()
    assert status == 200
    assert [line["seq"] for line in parse(content.decode())] == list(range(1, 51))
    # Fifty events, ten full batches of five and an empty eleventh; the first went out before most were read.
    assert len(reads) == 11 and read_by_then < 4
