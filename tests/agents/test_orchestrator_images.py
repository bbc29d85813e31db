"""A prompt's images reach the models that can see them, and only those: the URLs it was submitted
with and the image artifacts its text references, as content parts after the text (an artifact as a
data URL, only in the request sent), for the router, the support workers and the primary; a
candidate that cannot see is skipped before any call. Bad image URLs are refused before anything is
created; forced roles that cannot see are refused with the reason."""

import base64
from collections.abc import Callable
from typing import Any

import pytest
from django.conf import LazySettings
from rest_framework.test import APIClient

from accounts.models import User
from agents.actions import load_profiles
from agents.models import TranscriptEntry
from agents.orchestrator.actions import load_brains
from agents.orchestrator.models import Prompt
from journal.models import JournalEvent
from sagas import actions
from sagas.models import Saga
from tests.agents.fake_llm import FakeLLM, Reply, say, tool_call
from tests.agents.orchestration_support import settled, submit
from tests.support import CeleryWorker

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 64
SHOT = "https://example.test/shot.png"
EYES = {"eyes-m": ["vision"]}


@pytest.fixture
def seeing_brain(transactional_db: None) -> None:
    """Every role's first candidate is text-only (`blind-m`), its fallback sees (`eyes-m`); the
    writer has no model that sees. Every prompt is reviewed."""
    load_profiles(
        entries=[
            {"name": f"s-{role}", "role": role.title(), "model": "blind-m", "fallback_models": ["eyes-m"],
             "model_capabilities": EYES, "tools": ["finish"], "max_turns": 4}
            for role in ("router", "coder", "tester", "review")
        ] + [{"name": "s-writer", "role": "Writer", "model": "blind-m", "tools": ["finish"], "max_turns": 4}]
    )  # fmt: skip
    load_brains(
        entries=[
            {"name": "seeing", "planner_profile": "s-router",
             "roles": {"coder": "s-coder", "tester": "s-tester", "writer": "s-writer", "review": "s-review"},
             "signals": {"coder": ["implement"], "tester": ["screenshot"], "writer": ["changelog"]},
             "default_primary": "coder", "review_role": "review", "review_by_default": True}
        ]
    )  # fmt: skip


def image_urls(body: dict[str, Any]) -> list[str]:
    return [
        part["image_url"]["url"]
        for message in body["messages"]
        if isinstance(message.get("content"), list)
        for part in message["content"]
        if part.get("type") == "image_url"
    ]


def test_the_images_go_to_the_models_that_see_and_the_others_are_skipped(
    worker: CeleryWorker, fake_llm: FakeLLM, seeing_brain: None, saga: Saga, alice: User,
    client_for: Callable[[User], APIClient],
) -> None:  # fmt: skip
    actions.add_artifact(saga=saga, name="screen.png", content=PNG, content_type="image/png", by=alice)

    def seen(body: dict[str, Any]) -> Reply:
        if "(review)" in body["messages"][0]["content"]:
            return say('{"decision": "approve", "confidence": 0.9}')
        return say("", tool_call("finish", {"result": "seen"}))

    fake_llm.rule("eyes-m", seen)
    client = client_for(alice)

    text = "Implement what this screenshot shows, with a changelog: @artifact:screen.png"
    started = submit(client, saga, prompt=text, brain="seeing", images=[SHOT])
    body = settled(client, started["prompt_id"])

    assert body["status"] == "completed", body
    plan = body["plan"]
    assert plan["images"] == [SHOT, "artifact:screen.png"]
    assert plan["primary_role"] == "coder" and [w["role"] for w in plan["workers"]] == ["tester"]  # not the writer
    assert fake_llm.calls_for("blind-m") == []  # no text-only model was asked anything
    data_url = "data:image/png;base64," + base64.b64encode(PNG).decode()
    calls = fake_llm.calls_for("eyes-m")
    assert len(calls) == 4  # the router, the tester, the primary, the reviewer
    for call in calls:
        assert image_urls(call) == [SHOT, data_url]
        assert call["messages"][1]["content"][0]["type"] == "text"
    skipped = JournalEvent.objects.filter(saga=saga, type="model_skipped")
    assert sorted(e.data["role"] for e in skipped) == ["Coder", "Review", "Tester", "router"]
    assert body["review"]["decision"] == "approve"
    assert {tuple(e.data["lacks"]) for e in skipped} == {("vision",)}
    # The transcripts keep the artifact's name, not its bytes.
    stored = TranscriptEntry.objects.filter(run__collaborator__saga=saga, message__role="user")
    kept = [p["image_url"]["url"] for e in stored if isinstance(e.message["content"], list)
            for p in e.message["content"] if p["type"] == "image_url"]  # fmt: skip
    assert kept == [SHOT, "artifact:screen.png"] * 3


def test_roles_that_cannot_see_are_refused_before_anything_is_created(
    seeing_brain: None, saga: Saga, alice: User, client_for: Callable[[User], APIClient]
) -> None:
    client, url = client_for(alice), f"/api/v1/sagas/{saga.pk}/prompts/"
    actions.add_artifact(saga=saga, name="screen.png", content=PNG, content_type="image/png", by=alice)
    load_profiles(entries=[{"name": "s-blind", "role": "Blind", "model": "blind-m", "tools": ["finish"]}])
    load_brains(entries=[{"name": "blind", "planner_profile": "s-blind", "roles": {"coder": "s-blind"},
                          "default_primary": "coder", "review_role": ""}])  # fmt: skip

    for body, field in [
        ({"prompt": "Say what you see.", "team": ["tester", "writer"], "images": [SHOT]}, "team"),
        ({"prompt": "Say what you see in @artifact:screen.png", "team": ["writer"]}, "team"),
        ({"prompt": "Say what you see.", "brain": "blind", "images": [SHOT]}, "images"),
        ({"prompt": "And in @artifact:screen.png?", "images": [SHOT] * 8}, "images"),  # nine images in all
    ]:
        response = client.post(url, {"brain": "seeing", **body}, format="json")
        assert response.status_code == 400 and response.json()["code"] == "invalid_payload", response.content
        assert list(response.json()["errors"]) == [field], body
    assert "writer cannot see" in client.post(url, {"prompt": "Look", "brain": "seeing", "team": ["writer"],
                                                     "images": [SHOT]}, format="json").json()["detail"]  # fmt: skip
    assert not Prompt.objects.exists()


def test_a_forced_role_that_can_no_longer_see_when_routed_fails_the_prompt_with_the_reason(
    seeing_brain: None, saga: Saga, alice: User, settings: LazySettings
) -> None:
    from agents.orchestrator import steps
    from agents.orchestrator.actions import submit_prompt

    settings.AGORA_HOOKS_INLINE = True  # the routing step runs hooks (none here), in this process
    prompt, _ = submit_prompt(saga=saga, by=alice, text="Look.", brain="seeing", team=["tester"], images=[SHOT])
    load_profiles(entries=[{"name": "s-tester", "role": "Tester", "model": "blind-m", "fallback_models": [],
                            "model_capabilities": {}, "tools": ["finish"]}])  # fmt: skip

    steps.advance(str(prompt.pk))

    prompt.refresh_from_db()
    assert prompt.status == Prompt.Status.FAILED and "tester cannot see" in prompt.reason
    assert prompt.plan is None


@pytest.mark.parametrize(
    "images",
    [
        ["file:///etc/passwd"],
        ["not a url"],
        ["https://"],
        [f"https://example.test/{'x' * 2000}.png"],
        [SHOT] * 9,
        [7],
        ["https://example.test/a\x07.png"],
    ],
)
def test_bad_image_urls_are_refused_before_anything_is_created(
    seeing_brain: None, saga: Saga, alice: User, client_for: Callable[[User], APIClient], images: list[Any]
) -> None:
    response = client_for(alice).post(
        f"/api/v1/sagas/{saga.pk}/prompts/", {"prompt": "Look", "brain": "seeing", "images": images}, format="json"
    )

    assert response.status_code == 400 and response.json()["code"] == "invalid_payload", response.content
    assert "images" in response.json()["errors"]
    assert not Prompt.objects.exists()


def test_the_prompt_box_takes_image_urls(seeing_brain: None, saga: Saga, alice: User) -> None:
    from django.test import Client

    client = Client()
    client.force_login(alice)
    page = client.get(f"/sagas/{saga.pk}/").content.decode()
    assert 'name="images"' in page

    sent = {"prompt": "Look at these.", "brain": "seeing"}
    # Not http(s); a host Python's URL splitter refuses (was a 500, here and over REST)
    for bad in ("ftp://example.test/a.png", "http://[::1", "https://example.test]/a.png"):
        refused = client.post(f"/sagas/{saga.pk}/prompts/", {**sent, "images": bad}, follow=True)
        assert "An image is not a URL." in refused.content.decode() and not Prompt.objects.exists()
        api = APIClient()
        api.force_authenticate(alice)
        over_rest = api.post(f"/api/v1/sagas/{saga.pk}/prompts/", {**sent, "images": [bad]}, format="json")
        assert over_rest.status_code == 400 and list(over_rest.json()["errors"]) == ["images"], over_rest.content

    client.post(f"/sagas/{saga.pk}/prompts/", {**sent, "images": f"{SHOT}\n https://example.test/two.png "})
    assert Prompt.objects.get().images == [SHOT, "https://example.test/two.png"]


def test_an_artifacts_data_url_is_made_once_per_task(saga: Saga, alice: User, django_assert_num_queries: Any) -> None:
    from agents.images import for_request, with_images

    actions.add_artifact(saga=saga, name="screen.png", content=PNG, content_type="image/png", by=alice)
    messages = [{"role": "user", "content": with_images("Look.", [SHOT, "artifact:screen.png"])}]
    found: dict[str, str] = {}

    with django_assert_num_queries(1):
        sent = for_request(messages, saga_id=saga.pk, found=found)
    data_url = "data:image/png;base64," + base64.b64encode(PNG).decode()
    assert [p.get("image_url", {}).get("url") or p["text"] for p in sent[0]["content"]] == ["Look.", SHOT, data_url]
    stored = messages[0]["content"]
    assert isinstance(stored, list) and stored[2]["image_url"]["url"] == "artifact:screen.png"  # stored as it was
    with django_assert_num_queries(0):  # the task's next call
        assert for_request(messages, saga_id=saga.pk, found=found) == sent
    gone = [{"role": "user", "content": with_images("And?", ["artifact:gone.png"])}]
    assert for_request(gone, saga_id=saga.pk)[0]["content"][1] == {
        "type": "text", "text": "[The image artifact gone.png was deleted.]"
    }  # fmt: skip


def test_a_review_role_that_cannot_see_is_skipped_and_the_plan_says_so(
    seeing_brain: None, saga: Saga, alice: User, settings: LazySettings
) -> None:
    from agents.orchestrator import steps
    from agents.orchestrator.actions import submit_prompt
    from tests.agents.orchestration_support import page_client

    settings.AGORA_HOOKS_INLINE = True  # the routing step runs hooks (none here), in this process
    load_profiles(entries=[{"name": "s-blind-review", "role": "Review", "model": "blind-m", "tools": ["finish"]}])
    load_brains(entries=[{"name": "half", "planner_profile": "s-router", "default_primary": "coder",
                          "roles": {"coder": "s-coder", "review": "s-blind-review"}, "review_role": "review",
                          "review_by_default": True}])  # fmt: skip
    looked, _ = submit_prompt(saga=saga, by=alice, text="Implement it.", brain="half", images=[SHOT])
    plain, _ = submit_prompt(saga=saga, by=alice, text="Implement it.", brain="half")

    for prompt in (looked, plain):
        steps.advance(str(prompt.pk))  # in this process: routing (no router answers here), the primary starts
        prompt.refresh_from_db()

    assert looked.plan is not None and looked.plan["requires_review"] is False
    assert looked.plan["review_skipped"] == "The review role cannot see the prompt's images."
    assert plain.plan is not None and plain.plan["requires_review"] is True and "review_skipped" not in plain.plan
    html = page_client(alice).get(f"/sagas/{saga.pk}/live/prompts/").content.decode()
    assert html.count("data-review-skipped") == 1 and "no review: The review role cannot see" in html
