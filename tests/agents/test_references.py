"""Reference expansion: `@artifact:<name>` and `@@<saga-id>`, vision, unknown names, and an
outsider's `@@` refused exactly as for a saga that does not exist."""

import uuid

import pytest
from django.db import transaction
from rest_framework.test import APIClient

from accounts.models import User
from agents.references import artifact_refs, check_references, expand_references, resolve_artifacts
from journal.actions import record
from sagas import actions, errors
from sagas.models import Run, Saga

pytestmark = pytest.mark.django_db

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 64


@pytest.fixture
def saga(alice: User) -> Saga:
    saga = actions.create_saga(title="Release v2", goal="Ship v2", owner=alice)
    for name, content, kind in [
        ("spec.md", b"# Spec\nOnly /v2 routes.", "text/markdown"),
        ("screen.png", PNG, "image/png"),
        ("dump.bin", b"\x00\x01", "application/octet-stream"),
    ]:
        actions.add_artifact(saga=saga, name=name, content=content, content_type=kind, by=alice)
    return saga


@pytest.fixture
def prior(alice: User) -> Saga:
    """Alice's earlier saga, with an orchestrated answer and an agent's result."""
    prior = actions.create_saga(title="Release v1", goal="Ship v1 without downtime", owner=alice)
    agent, _ = actions.add_agent(
        saga=prior, name="coder", role="Coder", task="Ship it", runtime="external", profile="", by=alice
    )
    with transaction.atomic():
        actions.finish_run(run=Run.objects.get(collaborator=agent), status="completed", result="Shipped v1 at noon.")
        record(saga_id=prior.pk, type="prompt.completed", actor="agent:coder", data={"answer": "v1 is live."})
    return prior


def test_an_artifact_reference_appends_its_text(saga: Saga, alice: User) -> None:
    text, images = expand_references(
        text="Follow @artifact:spec.md. Then @artifact:spec.md again.", saga=saga, user=alice
    )

    assert images == []
    assert text == (
        "Follow @artifact:spec.md. Then @artifact:spec.md again.\n\n"
        "--- @artifact:spec.md (text/markdown, 23 bytes) ---\n# Spec\nOnly /v2 routes."
    )


def test_an_image_artifact_is_listed_for_the_models_that_can_see(saga: Saga, alice: User) -> None:
    text, images = expand_references(text="What is wrong in @artifact:screen.png?", saga=saga, user=alice)

    assert images == ["screen.png"] and "--- @artifact:screen.png (image/png, 72 bytes) ---" in text
    both = "@artifact:screen.png @artifact:spec.md"
    assert expand_references(text=both, saga=saga, user=alice).images == ["screen.png"]
    assert check_references(text=both, saga=saga, user=alice) == ["screen.png"]
    assert "[A file; download it" in expand_references(text="@artifact:dump.bin", saga=saga, user=alice).text


def test_a_saga_reference_appends_its_goal_answers_results_and_last_events(
    saga: Saga, prior: Saga, alice: User
) -> None:
    text, images = expand_references(text=f"Do as in @@{prior.pk}.", saga=saga, user=alice)

    section = text.split("\n\n", 1)[1]
    assert section.startswith(f"--- @@{prior.pk}: Release v1 (open) ---\nGoal: Ship v1 without downtime\n")
    assert "Final answers:\n- v1 is live.\n" in section
    assert "Results:\n- agent:coder (completed): Shipped v1 at noon.\n" in section
    assert "Last events:\n- #1 saga.created human:alice" in section and "prompt.completed agent:coder" in section
    assert images == []


def test_an_outsider_s_saga_reference_is_refused_as_if_the_saga_did_not_exist(prior: Saga, mallory: User) -> None:
    own = actions.create_saga(title="Mallory's", owner=mallory)
    with pytest.raises(errors.NotFound) as hidden:
        expand_references(text=f"Summarize @@{prior.pk}", saga=own, user=mallory)
    nobody = uuid.uuid4()
    with pytest.raises(errors.NotFound) as absent:
        expand_references(text=f"Summarize @@{nobody}", saga=own, user=mallory)

    assert hidden.value.detail == f"No saga {prior.pk}." and absent.value.detail == f"No saga {nobody}."
    assert hidden.value.extra == absent.value.extra == {}
    assert (hidden.value.code, hidden.value.status) == (absent.value.code, absent.value.status) == ("not_found", 404)
    with pytest.raises(errors.NotFound, match=r"No saga not-a-saga\."):
        expand_references(text="Summarize @@not-a-saga", saga=own, user=mallory)


def test_unknown_artifacts_are_named_in_one_invalid_payload(saga: Saga, prior: Saga, alice: User) -> None:
    with pytest.raises(errors.InvalidPayload) as refused:
        expand_references(text="@artifact:spec.md @artifact:nope.md @artifact:ghost", saga=saga, user=alice)

    assert refused.value.detail == "Unknown artifacts in this saga: nope.md, ghost."
    assert refused.value.extra["errors"] == {
        "artifacts": ["No artifact nope.md in this saga.", "No artifact ghost in this saga."]
    }
    # An artifact of another saga is not this saga's.
    actions.add_artifact(saga=prior, name="old.md", content=b"v1 notes", content_type="text/plain", by=alice)
    with pytest.raises(errors.InvalidPayload, match=r"old\.md"):
        expand_references(text="@artifact:old.md", saga=saga, user=alice)


def test_text_without_references_is_unchanged(saga: Saga, alice: User) -> None:
    plain = "Mail ops@example.com about the @artifact: plan; a@@b is not a reference."
    assert expand_references(text=plain, saga=saga, user=alice) == (plain, [])


def test_a_worker_result_references_artifacts_by_name(saga: Saga) -> None:
    refs = artifact_refs(saga=saga, names=["spec.md", "screen.png", "spec.md"])

    assert [(r["name"], r["content_type"], r["size"]) for r in refs] == [
        ("spec.md", "text/markdown", 23),
        ("screen.png", "image/png", 72),
    ]
    with pytest.raises(errors.InvalidPayload, match="Unknown artifacts in this saga: nope"):
        artifact_refs(saga=saga, names=["spec.md", "nope"])


def test_resolved_artifacts_are_context_references_to_their_download(saga: Saga, alice: User) -> None:
    found, unknown = resolve_artifacts(saga=saga, names=["spec.md", "nope", "spec.md"])

    assert unknown == ["nope"] and list(found) == ["spec.md"]
    ref = found["spec.md"]
    assert (ref["kind"], ref["label"]) == ("artifact", "spec.md")
    assert ref["uri"] == f"/api/v1/sagas/{saga.pk}/artifacts/spec.md"
    client = APIClient()
    client.force_authenticate(alice)
    download = client.get(ref["uri"])
    assert download.status_code == 200 and download.content == b"# Spec\nOnly /v2 routes."


def test_a_saga_summary_shows_only_the_events_the_reader_may_see(prior: Saga, alice: User, bob: User) -> None:
    actions.add_human(saga=prior, user=bob, role="Analyst", task="Read along", by=alice)
    coder = actions.find_collaborator(prior, "agent:coder")
    assert coder is not None
    actions.steer(saga=prior, to=coder, message="Use the secret staging host.", by=alice)
    own = actions.create_saga(title="Bob's", owner=bob)

    for_bob = expand_references(text=f"@@{prior.pk}", saga=own, user=bob).text
    for_alice = expand_references(text=f"@@{prior.pk}", saga=prior, user=alice).text

    assert "steering.message" in for_alice and "steering.message" not in for_bob  # alice and coder's only
    assert "Shipped v1 at noon." in for_bob and "v1 is live." in for_bob
