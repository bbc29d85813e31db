"""Inputs refused with `invalid_payload` before anything is stored: a goal or task over
`AGORA_MAX_GOAL_CHARS`, a form over the payload limit, names and types that end in a newline (a `$`
in a pattern matches before a final newline), and `timeout_s: true` (a boolean is not a number)."""

from typing import Any

import pytest
from django.conf import LazySettings
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from accounts.models import User
from sagas import errors
from sagas.actions import add_agent, add_artifact, add_human, ask_agent, ask_human, create_saga
from sagas.models import AgentRequest, Artifact, Collaborator, HumanRequest, Saga
from tests.sagas.api_http import client_for, problem
from tests.sagas.kernel import Team, field_errors

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fast_passwords")]


@pytest.fixture
def small_limits(settings: LazySettings) -> None:
    settings.AGORA_MAX_GOAL_CHARS = 100
    settings.AGORA_MAX_PAYLOAD_BYTES = 1000


# --- goals and tasks ---------------------------------------------------------------------------


@pytest.mark.usefixtures("small_limits")
def test_a_goal_is_taken_up_to_the_limit_and_refused_past_it(alice: User) -> None:
    assert create_saga(title="At the limit", goal="g" * 100, owner=alice).goal == "g" * 100
    with pytest.raises(errors.InvalidPayload) as refused:
        create_saga(title="Past it", goal="g" * 101, owner=alice)
    assert "goal" in field_errors(refused)
    assert not Saga.objects.filter(title="Past it").exists()


def test_a_300_kb_goal_is_refused_over_the_api_and_the_dashboard(alice: User) -> None:
    goal = "g" * 300_000
    body = problem(client_for(alice).post("/api/v1/sagas/", {"title": "Big", "goal": goal}, format="json"), 400,
                   "invalid_payload")  # fmt: skip
    assert "goal" in body["errors"]
    browser = Client()
    browser.force_login(alice)
    assert browser.post("/sagas/new/", {"title": "Big", "goal": goal, "policy": "tree"}).status_code == 400
    assert not Saga.objects.filter(title="Big").exists()


def test_a_title_over_200_characters_is_refused_by_the_kernel(alice: User) -> None:
    with pytest.raises(errors.InvalidPayload):
        create_saga(title="t" * 201, owner=alice)


@pytest.mark.usefixtures("small_limits")
def test_a_task_past_the_limit_is_refused(team: Team, alice: User, mallory: User) -> None:
    with pytest.raises(errors.InvalidPayload) as refused:
        add_agent(saga=team.saga, name="big", role="r", task="t" * 101, runtime="external", by=alice)
    assert "task" in field_errors(refused)
    with pytest.raises(errors.InvalidPayload):
        add_human(saga=team.saga, user=mallory, role="r", task="t" * 101, by=alice)
    assert not Collaborator.objects.filter(saga=team.saga, name__in=["big", "mallory"]).exists()


# --- the saga page's forms: every field within its column, as the API's serializers have it ----


def signed_in(user: User) -> Client:
    browser = Client()
    browser.force_login(user)
    return browser


def test_a_role_past_its_column_is_refused_and_the_form_says_so(team: Team, alice: User, mallory: User) -> None:
    with pytest.raises(errors.InvalidPayload) as refused:
        add_human(saga=team.saga, user=mallory, role="r" * 121, task="t", by=alice)
    assert "role" in field_errors(refused)
    page, role = signed_in(alice), "r" * 121
    person = page.post(f"/sagas/{team.saga.pk}/people/", {"username": "mallory", "role": role})
    agent = page.post(f"/sagas/{team.saga.pk}/agents/", {"name": "scribe", "role": role, "runtime": "external"})
    for response in (person, agent):
        assert response.status_code == 400
        assert "Text of at most 120 characters." in response.content.decode()
    assert not Collaborator.objects.filter(saga=team.saga, name__in=["mallory", "scribe"]).exists()
    assert add_human(saga=team.saga, user=mallory, role="r" * 120, task="t", by=alice).role == "r" * 120


def test_an_external_agents_profile_past_its_column_is_refused(team: Team, alice: User) -> None:
    form = {"name": "scribe", "runtime": "external", "profile": "p" * 65}
    response = signed_in(alice).post(f"/sagas/{team.saga.pk}/agents/", form)
    assert response.status_code == 400
    assert "at most 64 characters" in response.content.decode()
    assert not Collaborator.objects.filter(saga=team.saga, name="scribe").exists()


def test_an_upload_whose_content_type_is_past_its_column_is_refused(team: Team, alice: User) -> None:
    kind = "application/" + "x" * 120
    upload = SimpleUploadedFile("a.bin", b"hello", content_type=kind)
    assert signed_in(alice).post(f"/sagas/{team.saga.pk}/artifacts/", {"file": upload}).status_code == 400
    with pytest.raises(errors.InvalidPayload) as refused:
        add_artifact(saga=team.saga, name="a.bin", content=b"hello", content_type=kind, by=alice)
    assert "content_type" in field_errors(refused)
    assert not Artifact.objects.exists()


def test_an_agent_past_the_sagas_cap_is_refused_on_the_page(team: Team, alice: User, settings: LazySettings) -> None:
    settings.AGORA_MAX_AGENTS_PER_SAGA = Collaborator.objects.filter(saga=team.saga, kind="agent").count()
    response = signed_in(alice).post(f"/sagas/{team.saga.pk}/agents/", {"name": "scribe", "runtime": "external"})
    assert response.status_code == 400
    assert f"This saga already has {settings.AGORA_MAX_AGENTS_PER_SAGA} agents." in response.content.decode()
    assert not Collaborator.objects.filter(saga=team.saga, name="scribe").exists()


# --- forms ---------------------------------------------------------------------------------------


def form_of(label: str, name: str = "ok") -> list[dict[str, Any]]:
    return [{"name": name, "label": label, "type": "boolean"}]


@pytest.mark.usefixtures("small_limits")
def test_a_form_over_the_payload_limit_is_refused(team: Team) -> None:
    ask_human(asker=team["coder"], title="Fits", fields=form_of("l" * 900))
    with pytest.raises(errors.InvalidPayload) as refused:
        ask_human(asker=team["coder"], title="Too big", fields=form_of("l" * 1000))
    assert "fields" in field_errors(refused)
    assert list(HumanRequest.objects.values_list("title", flat=True)) == ["Fits"]


def test_300_kb_of_labels_are_refused_over_the_api(team: Team) -> None:
    fields = [{"name": f"f{i}", "label": "l" * 6_000, "type": "text"} for i in range(50)]
    body = problem(
        client_for(team.user("coder"), "Bearer").post(
            f"/api/v1/sagas/{team.saga.pk}/human-requests/", {"title": "Big", "fields": fields}, format="json"
        ),
        400,
        "invalid_payload",
    )
    assert "fields" in body["errors"]
    assert not HumanRequest.objects.exists()


@pytest.mark.parametrize("name", ["ok\n", "ok\r\n", "\nok", "ok ", "o k"])
def test_a_field_name_with_a_newline_or_space_is_refused(team: Team, name: str) -> None:
    with pytest.raises(errors.InvalidPayload):
        ask_human(asker=team["coder"], title="Sign-off", fields=form_of("OK?", name=name))


# --- names and types of the kernel's patterns ----------------------------------------------------


@pytest.mark.parametrize("name", ["scribe\n", "scribe\r", " scribe", "Scribe"])
def test_an_agent_name_must_match_whole(team: Team, alice: User, name: str) -> None:
    with pytest.raises(errors.InvalidPayload):
        add_agent(saga=team.saga, name=name, role="r", task="t", runtime="external", by=alice)
    assert add_agent(saga=team.saga, name="scribe", role="r", task="t", runtime="external", by=alice)[0]


@pytest.mark.parametrize("type_", ["review\n", "code.review\n", "review.", " review"])
def test_a_request_type_must_match_whole(team: Team, type_: str) -> None:
    with pytest.raises(errors.InvalidPayload) as refused:
        ask_agent(sender=team["coder"], to="agent:lead", type=type_, payload={})
    assert "type" in field_errors(refused)
    assert not AgentRequest.objects.exists()


# --- timeout_s -----------------------------------------------------------------------------------


@pytest.mark.parametrize("timeout", [True, False, float("nan"), float("inf"), "5"])
def test_a_timeout_must_be_a_finite_number_for_the_kernel(team: Team, timeout: Any) -> None:
    with pytest.raises(errors.InvalidPayload) as refused:
        ask_agent(sender=team["coder"], to="agent:lead", type="plan", payload={}, mode="wait", timeout_s=timeout)
    assert "timeout_s" in field_errors(refused)
    assert not AgentRequest.objects.exists()


@pytest.mark.parametrize("timeout", [True, False])
def test_timeout_s_true_is_refused_over_the_api(team: Team, timeout: bool) -> None:
    api = client_for(team.user("coder"), "Bearer")
    body = {"to": "agent:lead", "type": "plan", "payload": {}, "mode": "wait", "timeout_s": timeout}
    refused = problem(api.post(f"/api/v1/sagas/{team.saga.pk}/requests/", body, format="json"), 400, "invalid_payload")
    assert "timeout_s" in refused["errors"]
    assert not AgentRequest.objects.exists()
