"""Artifacts: added through REST (JSON text or multipart file) and the dashboard, size limit,
content type recorded, downloadable by whoever may see the saga, 404 for everyone else."""

import hashlib
from pathlib import Path
from typing import ClassVar

import pytest
from django.conf import LazySettings
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.files.uploadhandler import FileUploadHandler
from django.test import Client

from accounts.actions import issue_token
from accounts.models import User
from journal.models import JournalEvent
from sagas import actions, errors
from sagas.models import Artifact
from tests.sagas.api_http import Http, client_for, problem
from tests.sagas.kernel import Team
from tests.support import WebServer

pytestmark = pytest.mark.usefixtures("fast_passwords")

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4


def url(team: Team, name: str = "") -> str:
    return f"/api/v1/sagas/{team.saga.pk}/artifacts/{name}"


def test_a_text_artifact_through_json_is_listed_and_downloaded_by_collaborators(
    team: Team, alice: User, bob: User
) -> None:
    added = client_for(alice).post(url(team), {"name": "spec.md", "text": "# Spec\nv2 only."}, format="json")

    assert added.status_code == 201, added.content
    assert added.headers["Location"] == url(team, "spec.md")  # where it downloads
    assert added.data | {"created_at": None} == {
        "name": "spec.md", "content_type": "text/plain", "size": 15, "added_by": "human:alice", "created_at": None,
        "sha256": hashlib.sha256(b"# Spec\nv2 only.").hexdigest(),
    }  # fmt: skip
    for reader in (alice, bob, team.user("coder")):
        listed = client_for(reader, "Bearer" if reader.is_agent else "Token").get(url(team))
        assert [a["name"] for a in listed.data["artifacts"]] == ["spec.md"]
        download = client_for(reader).get(url(team, "spec.md"), HTTP_ACCEPT="application/octet-stream")
        assert download.status_code == 200 and download.content == b"# Spec\nv2 only."
        assert download["Content-Type"] == "text/plain"
        assert download["Content-Disposition"] == "attachment; filename*=UTF-8''spec.md"
    event = JournalEvent.objects.get(saga=team.saga, type="artifact.added")
    assert event.actor == "human:alice" and event.data["size"] == 15


def test_a_file_through_multipart_keeps_its_content_type_and_bytes(team: Team, bob: User) -> None:
    upload = SimpleUploadedFile("diagram.png", PNG, content_type="image/png")
    added = client_for(bob).post(url(team), {"file": upload}, format="multipart")

    assert added.status_code == 201, added.content
    assert (added.data["name"], added.data["content_type"], added.data["size"]) == ("diagram.png", "image/png", 1032)
    assert client_for(bob).get(url(team, "diagram.png")).content == PNG
    assert Artifact.objects.get(saga=team.saga, name="diagram.png").is_image


def test_an_agent_attaches_an_artifact_under_its_own_id(team: Team) -> None:
    coder = client_for(team.user("coder"), "Bearer")
    body = {"name": "result.json", "text": '{"ok": true}', "content_type": "application/json"}
    added = coder.post(url(team), body, format="json")
    assert added.status_code == 201 and added.data["added_by"] == "agent:coder"


def test_outsiders_get_404_for_the_list_the_upload_and_the_download(team: Team, alice: User, mallory: User) -> None:
    client_for(alice).post(url(team), {"name": "secret.txt", "text": "launch codes"}, format="json")
    spy = client_for(mallory)

    missing = "/api/v1/sagas/00000000-0000-0000-0000-000000000000/artifacts/"
    hidden, absent = problem(spy.get(url(team)), 404, "not_found"), problem(spy.get(missing), 404, "not_found")
    assert hidden["detail"].replace(str(team.saga.pk), "?") == absent["detail"].replace(missing.split("/")[4], "?")
    problem(spy.get(url(team, "secret.txt")), 404, "not_found")
    problem(spy.post(url(team), {"name": "x.txt", "text": "hi"}, format="json"), 404, "not_found")
    assert list(Artifact.objects.values_list("name", flat=True)) == ["secret.txt"]
    page = Client()
    page.force_login(mallory)
    assert page.get(f"/sagas/{team.saga.pk}/artifacts/secret.txt").status_code == 404
    assert page.post(f"/sagas/{team.saga.pk}/artifacts/", {"name": "x.txt", "text": "hi"}).status_code == 404


def test_size_limit_name_rules_and_duplicates(team: Team, alice: User, settings: LazySettings) -> None:
    settings.AGORA_MAX_ARTIFACT_BYTES = 1000
    api = client_for(alice)

    big = SimpleUploadedFile("big.bin", b"x" * 1001, content_type="application/octet-stream")
    problem(api.post(url(team), {"file": big}, format="multipart"), 413, "payload_too_large")
    huge = SimpleUploadedFile("huge.bin", b"x" * 200_000, content_type="application/octet-stream")
    problem(api.post(url(team), {"file": huge}, format="multipart"), 413, "payload_too_large")  # refused unread
    problem(api.post(url(team), {"name": "../etc/passwd", "text": "x"}, format="json"), 400, "invalid_payload")
    problem(api.post(url(team), {"name": "a.txt", "text": ""}, format="json"), 400, "invalid_payload")
    bad_text = SimpleUploadedFile("b.txt", b"\xff\xfe", content_type="text/plain")
    problem(api.post(url(team), {"file": bad_text}, format="multipart"), 400, "invalid_payload")
    assert api.post(url(team), {"name": "a.txt", "text": "one"}, format="json").status_code == 201
    problem(api.post(url(team), {"name": "a.txt", "text": "two"}, format="json"), 409, "name_taken")
    assert client_for(alice).get(url(team, "a.txt")).content == b"one"
    assert Artifact.objects.count() == 1
    assert JournalEvent.objects.filter(type="artifact.added").count() == 1


class Received(FileUploadHandler):
    """Put first among the upload handlers: counts the bytes of files the parse hands them."""

    counted: ClassVar[list[int]] = []

    def receive_data_chunk(self, raw_data: bytes, start: int) -> bytes:
        Received.counted.append(len(raw_data))
        return raw_data

    def file_complete(self, file_size: int) -> None:
        return None


@pytest.mark.parametrize("where", ["page", "api"])
def test_an_upload_over_the_limit_is_not_read_past_it(
    team: Team, bob: User, settings: LazySettings, where: str
) -> None:
    """A middleware reads the form before the view checks the size (the page's input check, CSRF's
    for a session on the API): a file of any size was parsed whole, to a temporary file on disk,
    before the refusal."""
    settings.AGORA_MAX_ARTIFACT_BYTES = 1000
    settings.FILE_UPLOAD_HANDLERS = [f"{__name__}.Received", *settings.FILE_UPLOAD_HANDLERS]
    Received.counted.clear()
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(bob)
    browser.get(f"/sagas/{team.saga.pk}/")  # the form's page sets the CSRF cookie
    form = {
        "csrfmiddlewaretoken": browser.cookies["csrftoken"].value,  # first, as the page's form sends it
        "file": SimpleUploadedFile("big.bin", b"x" * 500_000, content_type="application/octet-stream"),
    }

    if where == "page":
        refused = browser.post(f"/sagas/{team.saga.pk}/artifacts/", form)
        assert refused.status_code == 400 and "An artifact holds at most 1000 bytes." in refused.content.decode()
    else:
        problem(browser.post(url(team), form), 413, "payload_too_large")
    assert sum(Received.counted) <= 1000 + FileUploadHandler.chunk_size
    assert not Artifact.objects.exists()


def test_the_kernel_checks_access_itself(team: Team, mallory: User) -> None:
    with pytest.raises(errors.NotFound):
        actions.add_artifact(saga=team.saga, name="x.txt", content=b"x", content_type="text/plain", by=mallory)


def test_the_saga_page_lists_uploads_and_links_downloads(team: Team, bob: User) -> None:
    page = Client()
    page.force_login(bob)
    saga_url = f"/sagas/{team.saga.pk}/"

    sent = page.post(f"{saga_url}artifacts/", {"file": SimpleUploadedFile("notes.txt", b"Remember v1.")})
    assert sent.status_code == 302 and sent["Location"].endswith("#artifacts")
    typed = page.post(f"{saga_url}artifacts/", {"name": "plan.md", "text": "1. Ship"})
    assert typed.status_code == 302

    html = page.get(saga_url).content.decode()
    assert f'href="{saga_url}artifacts/notes.txt"' in html and f'href="{saga_url}artifacts/plan.md"' in html
    assert page.get(f"{saga_url}artifacts/plan.md").content == b"1. Ship"

    again = page.post(f"{saga_url}artifacts/", {"name": "plan.md", "text": "2. Ship"})
    assert again.status_code == 400 and "already has an artifact named plan.md" in again.content.decode()
    empty = page.post(f"{saga_url}artifacts/", {"name": "x.md"})
    assert empty.status_code == 400 and "Choose a file or write a text." in empty.content.decode()


@pytest.mark.integration
def test_the_real_server_leaves_a_malformed_upload_to_the_app_which_refuses_it_with_a_problem(
    transactional_db: None, redis_url: str, artifacts: Path, alice: User
) -> None:
    server = WebServer(redis_url, artifacts)
    try:
        saga = actions.create_saga(title="Uploads", owner=alice)
        web, url = Http(server.url, issue_token(user=alice), scheme="Token"), f"/api/v1/sagas/{saga.pk}/artifacts/"
        form = {"Content-Type": "multipart/form-data; boundary=b0undary"}
        for body in (b"--b0undary--\r\n", b"not a multipart body"):  # daphne's server answered both itself
            refused = web.call("POST", url, raw=body, headers=form)
            assert (refused.status, refused.headers["content-type"]) == (400, "application/problem+json"), refused
            assert refused.body["code"] == "invalid_payload" and "file" in refused.body["errors"]
        upload = (
            b'--b0undary\r\nContent-Disposition: form-data; name="file"; filename="notes.txt"\r\n'
            b"Content-Type: text/plain\r\n\r\nhello\r\n--b0undary--\r\n"
        )
        added = web.call("POST", url, raw=upload, headers=form).ok(201)
        assert (added["name"], added["size"]) == ("notes.txt", 5)
        assert list(Artifact.objects.filter(saga=saga).values_list("name", flat=True)) == ["notes.txt"]
    finally:
        server.stop()


@pytest.mark.parametrize("refused", ["files", "fields", "query"])
def test_what_django_refuses_while_reading_a_request_is_a_problem_with_a_code(
    team: Team, bob: User, refused: str
) -> None:
    """More files or fields than Django reads (DATA_UPLOAD_MAX_NUMBER_FILES, _FIELDS), in a body or
    a query string: its refusal answered an HTML page without a code."""
    api = client_for(bob)
    many = {f"k{i}": "v" for i in range(1001)}
    if refused == "files":
        files = {f"f{i}": SimpleUploadedFile(f"a{i}.txt", b"x") for i in range(101)}
        answered = api.post(url(team), {"file": SimpleUploadedFile("a.txt", b"x"), **files}, format="multipart")
    elif refused == "fields":
        answered = api.post(url(team), {"file": SimpleUploadedFile("a.txt", b"x"), **many}, format="multipart")
    else:
        answered = api.get(url(team) + "?" + "&".join(f"{k}={v}" for k, v in many.items()))

    limit = "100 files" if refused == "files" else "1000 fields"
    assert problem(answered, 400, "invalid_payload")["detail"] == f"More than {limit} in one request."
    assert not Artifact.objects.exists()


def test_a_typed_text_past_the_body_limit_on_the_page_says_the_limit(
    team: Team, bob: User, settings: LazySettings
) -> None:
    """The page's text box posts a form field, held to DATA_UPLOAD_MAX_MEMORY_SIZE while a
    middleware reads it, before the view: the page says so, with the limit (was a bare 400)."""
    page = Client()
    page.force_login(bob)
    text = "x" * (settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1)

    posted = page.post(f"/sagas/{team.saga.pk}/artifacts/", {"name": "notes.md", "text": text})

    assert posted.status_code == 413
    assert f"Limit is {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes for a request body." in posted.content.decode()
    assert not Artifact.objects.exists()
