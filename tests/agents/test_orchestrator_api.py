"""The orchestrator's REST API at its door: who may submit a prompt and who may read one, bad input
refused with the field it names, and retries with an idempotency key answered as the first. No
worker runs: nothing submitted here is routed."""

from collections.abc import Callable

from rest_framework.test import APIClient

from accounts.models import User
from agents.orchestrator.models import Prompt
from sagas.models import Collaborator, Saga
from tests.agents.orchestration_support import submit


def test_only_managers_submit_and_outsiders_see_nothing(
    default_brain: None, saga: Saga, alice: User, bob: User, mallory: User, client_for: Callable[[User], APIClient]
) -> None:
    from sagas import actions

    actions.add_human(saga=saga, user=bob, role="Analyst", task="Watch", by=alice)
    for body in ({"prompt": "Do it"}, {"prompt": ""}):  # refused before its body is looked at
        response = client_for(bob).post(f"/api/v1/sagas/{saga.pk}/prompts/", body, format="json")
        assert response.status_code == 403 and response.json()["code"] == "forbidden"
    response = client_for(mallory).post(f"/api/v1/sagas/{saga.pk}/prompts/", {"prompt": "Do it"}, format="json")
    assert response.status_code == 404 and response.json()["code"] == "not_found"
    assert not Prompt.objects.exists()
    assert not Collaborator.objects.filter(saga=saga, name__startswith="brain-").exists()

    prompt_id = submit(client_for(alice), saga, prompt="Do it")["prompt_id"]
    assert client_for(mallory).get(f"/api/v1/prompts/{prompt_id}/").json()["code"] == "not_found"
    assert client_for(bob).get(f"/api/v1/prompts/{prompt_id}/").status_code == 200


def test_bad_input_is_refused_and_retries_are_idempotent(
    default_brain: None, saga: Saga, alice: User, client_for: Callable[[User], APIClient]
) -> None:
    client = client_for(alice)
    url = f"/api/v1/sagas/{saga.pk}/prompts/"
    for body, field in [({"prompt": ""}, "prompt"), ({"prompt": "x", "team": ["wizard"]}, "team"),
                        ({"prompt": "x", "brain": "nope"}, "brain")]:  # fmt: skip
        response = client.post(url, body, format="json")
        assert response.status_code == 400 and response.json()["code"] == "invalid_payload", body
        assert field in response.json()["errors"]
    assert not Prompt.objects.exists()

    first = client.post(url, {"prompt": "Do it"}, format="json", HTTP_IDEMPOTENCY_KEY="k1")
    again = client.post(url, {"prompt": "Do it"}, format="json", HTTP_IDEMPOTENCY_KEY="k1")
    assert first.status_code == again.status_code == 202 and first.json() == again.json()
    assert ("Idempotent-Replayed" not in first.headers, again.headers["Idempotent-Replayed"]) == (True, "true")
    followed = f"/api/v1/prompts/{first.json()['prompt_id']}/"
    assert first.headers["Location"] == again.headers["Location"] == followed
    assert client.get(followed).json()["status"] == "running"
    document = client.get("/api/v1/schema/?format=json").json()
    schema = document["components"]["schemas"]["PromptCreateInput"]
    assert "minLength" not in schema["properties"]["brain"]  # its default, "", is valid
    create = document["paths"]["/api/v1/sagas/{saga_id}/prompts/"]["post"]["responses"]
    assert {"400", "403", "404", "409", "413"} <= set(create)  # an oversized body is 413, as everywhere
    problem = create["413"]["content"]["application/problem+json"]["schema"]
    assert problem == {"$ref": "#/components/schemas/ProblemOutput"}
    named = client.post(url, {"prompt": "Do it", "brain": "default"}, format="json", HTTP_IDEMPOTENCY_KEY="k1")
    assert (named.status_code, named.json()) == (202, first.json())  # the default, named or left out: one body
    Prompt.objects.update(status=Prompt.Status.COMPLETED)  # as if it ran meanwhile: a replay answers as first
    assert client.post(url, {"prompt": "Do it"}, format="json", HTTP_IDEMPOTENCY_KEY="k1").json() == first.json()
    other = client.post(url, {"prompt": "Something else"}, format="json", HTTP_IDEMPOTENCY_KEY="k1")
    assert other.status_code == 409 and other.json()["code"] == "idempotency_conflict"
    assert Prompt.objects.count() == 1
    Saga.objects.filter(pk=saga.pk).update(status=Saga.Status.CANCELLED)
    ended = client.post(url, {"prompt": "Too late"}, format="json")
    assert ended.status_code == 409 and ended.json()["code"] == "saga_finished"
    assert Prompt.objects.count() == 1


def test_a_sagas_prompts_are_listed_newest_first_for_who_may_see_it(
    default_brain: None, saga: Saga, alice: User, bob: User, mallory: User, client_for: Callable[[User], APIClient]
) -> None:
    from sagas import actions

    url = f"/api/v1/sagas/{saga.pk}/prompts/"
    assert client_for(alice).get(url).json() == {"prompts": []}
    first = submit(client_for(alice), saga, prompt="First")["prompt_id"]
    second = submit(client_for(alice), saga, prompt="Second")["prompt_id"]
    actions.add_human(saga=saga, user=bob, role="Analyst", task="Watch", by=alice)

    listed = client_for(bob).get(url).json()["prompts"]
    assert [(p["prompt_id"], p["prompt"], p["status"]) for p in listed] == [
        (second, "Second", "running"), (first, "First", "running")
    ]  # fmt: skip
    assert listed[0]["lead"].startswith("agent:brain-") and listed[0]["brain"] == "default"
    assert "results" not in listed[0]  # each one whole at its own address
    response = client_for(mallory).get(url)
    assert response.status_code == 404 and response.json()["code"] == "not_found"
    assert APIClient().get(url).status_code == 401


def test_no_collaborator_takes_a_workers_name_before_the_orchestration_does(
    default_brain: None, saga: Saga, alice: User, client_for: Callable[[User], APIClient]
) -> None:
    """A worker's name is derived from the prompt's lead, which anyone in the saga reads: an agent
    (or a manager) adding its own under that name first would fail the step that delegates it."""
    from sagas import actions

    scout, _ = actions.add_agent(saga=saga, name="scout", role="", task="", runtime="external", by=alice)
    lead = submit(client_for(alice), saga, prompt="Do it")["lead"].removeprefix("agent:")
    for who in (scout.user, alice):
        body = {"kind": "agent", "name": f"{lead}.primary", "runtime": "external"}
        response = client_for(who).post(f"/api/v1/sagas/{saga.pk}/collaborators/", body, format="json")
        assert (response.status_code, response.json()["code"]) == (409, "name_taken")
    assert not Collaborator.objects.filter(saga=saga, name=f"{lead}.primary").exists()
