"""Cancelling a running prompt: only managers of its saga may, over REST and from its plan view; the
prompt fails with the reason, every run it started that is still at work is cancelled with it, and
a worker whose model call was in flight loses its turn: its answer is dropped and no step follows.
Advanced in this process (no worker runs it), then through a real worker mid-call."""

import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.conf import LazySettings
from django.test import Client
from rest_framework.test import APIClient

from accounts.models import User
from agents.orchestrator import steps
from agents.orchestrator.actions import submit_prompt
from agents.orchestrator.models import Prompt
from agents.orchestrator.tasks import run_here
from journal.models import JournalEvent
from sagas import actions
from sagas.models import Collaborator, Run, Saga
from tests.agents.fake_llm import FakeLLM, say, tool_call
from tests.agents.orchestration_support import submit
from tests.support import CeleryWorker, wait_until

pytestmark = pytest.mark.usefixtures("fake_brain")


def routed(saga: Saga, alice: User, settings: LazySettings) -> tuple[Prompt, list]:
    """A prompt with two support workers, routed here: the tester claimed for this process (its
    turn not run yet), the writer queued."""
    settings.AGORA_HOOKS_INLINE = True  # the routing step runs hooks (none here), in this process
    prompt, _ = submit_prompt(saga=saga, by=alice, text="Implement it.", brain="fake", team=["tester", "writer"])
    here = steps.advance(str(prompt.pk), worker="w1@host")
    assert [t.collaborator.name for t in here] == [prompt.worker_name("tester")]
    return prompt, here


def statuses(saga: Saga, prompt: Prompt) -> dict[str, str]:
    """The status of the lead's run and of each run it started, by slot (`lead`, `tester`, …)."""
    agents = Collaborator.objects.filter(saga=saga, name__startswith=prompt.lead_name).select_related("run")
    return {c.name.removeprefix(prompt.lead_name).lstrip(".") or "lead": c.run.status for c in agents}


def test_a_manager_cancels_a_running_prompt_and_the_work_it_started(
    saga: Saga,
    alice: User,
    bob: User,
    mallory: User,
    model_here: FakeLLM,
    client_for: Callable[[User], APIClient],
    settings: LazySettings,
) -> None:
    actions.add_human(saga=saga, user=bob, role="Analyst", task="Watch", by=alice)
    model_here.script("tester-m", say("", tool_call("finish", {"result": "Tested."})))
    prompt, here = routed(saga, alice, settings)
    url = f"/api/v1/prompts/{prompt.pk}/cancel/"
    writer = Collaborator.objects.get(saga=saga, name=prompt.worker_name("writer"))
    asked, _ = actions.ask_agent(sender=writer, to=f"agent:{prompt.lead_name}", type="t", payload={})
    form, _ = actions.ask_human(
        asker=writer, title="Tone?", fields=[{"name": "tone", "type": "text"}], to="human:alice"
    )

    outsider, viewer = client_for(mallory).post(url), client_for(bob).post(url)
    assert (outsider.status_code, outsider.json()["code"]) == (404, "not_found")
    assert (viewer.status_code, viewer.json()["code"]) == (403, "forbidden")
    assert Prompt.objects.get(pk=prompt.pk).status == "running"
    assert statuses(saga, prompt) == {"lead": "idle", "tester": "running", "writer": "queued"}

    response = client_for(alice).post(url)

    assert response.status_code == 200
    body = response.json()
    assert (body["status"], body["reason"], body["prompt_id"]) == (
        "failed",
        "Cancelled by human:alice.",
        str(prompt.pk),
    )
    assert statuses(saga, prompt) == {"lead": "failed", "tester": "cancelled", "writer": "cancelled"}
    asked.refresh_from_db()
    form.refresh_from_db()
    assert (asked.status, form.status) == ("cancelled", "cancelled")  # what the writer was waiting for
    events = JournalEvent.objects.filter(saga=saga, type__in=["run.cancelled", "prompt.failed"]).order_by("seq")
    assert [(e.type, e.actor) for e in events] == [
        ("run.cancelled", "human:alice"),
        ("run.cancelled", "human:alice"),
        ("prompt.failed", f"agent:{prompt.lead_name}"),
    ]
    assert events.last().data["reason"] == "Cancelled by human:alice."  # type: ignore[union-attr]
    again = client_for(alice).post(url)  # a retry learns it has ended
    assert (again.status_code, again.json()["code"]) == (409, "invalid_state")
    assert "failed" in again.json()["detail"]

    # The tester's turn, claimed before the cancel, runs now: whatever its model answers is dropped.
    run_here(here)
    steps.advance(str(prompt.pk))  # a doorbell that comes after: nothing to do

    assert len(model_here.calls_for("tester-m")) <= 1  # if it was called, its answer was dropped

    assert statuses(saga, prompt) == {"lead": "failed", "tester": "cancelled", "writer": "cancelled"}
    assert not JournalEvent.objects.filter(saga=saga, type__in=["worker_end", "primary.completed"]).exists()
    assert Prompt.objects.get(pk=prompt.pk).status == "failed"
    detail = client_for(bob).get(f"/api/v1/prompts/{prompt.pk}/").json()
    assert (detail["status"], detail["reason"], detail["results"]) == ("failed", "Cancelled by human:alice.", [])


def test_a_worker_that_leads_a_team_takes_its_teammates_down_with_it(
    saga: Saga, alice: User, client_for: Callable[[User], APIClient], settings: LazySettings
) -> None:
    """Cancelled with the prompt, it ends as any lead does: its teammates are shut down, journaled
    with the lead's end as their reason."""
    prompt, _ = routed(saga, alice, settings)
    writer = Collaborator.objects.get(saga=saga, name=prompt.worker_name("writer"))
    mate, _ = actions.spawn_teammate(
        lead=writer, name="mate", role="Mate", prompt="p", profile=writer.profile, by=alice
    )

    assert client_for(alice).post(f"/api/v1/prompts/{prompt.pk}/cancel/").status_code == 200

    why = f"The team's lead {writer.handle} ended (cancelled)."
    run = Run.objects.get(collaborator=mate)
    assert (run.status, run.error) == (Run.Status.SHUTDOWN, why)
    ended = JournalEvent.objects.filter(saga=saga, run_id__in=[writer.run.pk, run.pk], type__startswith="run.")
    assert [(e.type, e.actor, e.data["error"]) for e in ended.order_by("seq")] == [
        ("run.cancelled", "human:alice", "Cancelled by human:alice."),
        ("run.shutdown", "human:alice", why),
    ]


def test_the_plan_view_offers_managers_a_cancel_button_while_it_runs(
    saga: Saga, alice: User, bob: User, settings: LazySettings
) -> None:
    actions.add_human(saga=saga, user=bob, role="Analyst", task="Watch", by=alice)
    prompt, _ = routed(saga, alice, settings)
    manager, viewer = Client(), Client()
    manager.force_login(alice)
    viewer.force_login(bob)
    live = f"/sagas/{saga.pk}/live/prompts/"
    page = f"/sagas/{saga.pk}/prompts/{prompt.pk}/"
    cancel = f"{page}cancel/"
    assert "data-cancel" in manager.get(live).content.decode()
    assert "data-cancel" in manager.get(page).content.decode()
    assert "data-cancel" not in viewer.get(live).content.decode()

    assert viewer.post(cancel).status_code == 403
    assert Prompt.objects.get(pk=prompt.pk).status == "running"
    sent = manager.post(cancel, {"back": "page"})

    assert (sent.status_code, sent["Location"]) == (302, page)
    assert Prompt.objects.get(pk=prompt.pk).reason == "Cancelled by human:alice."
    shown = manager.get(page).content.decode()
    assert "data-cancel" not in shown and "Cancelled by human:alice." in shown
    again = manager.post(cancel, follow=True)  # an old page's button: the prompt has ended, said plainly
    assert again.redirect_chain[-1][0] == f"/sagas/{saga.pk}/#prompts"
    assert "Prompt not cancelled: The prompt has ended: it is failed." in again.content.decode()


def test_the_schema_describes_the_cancel(alice: User, client_for: Callable[[User], APIClient]) -> None:
    document = client_for(alice).get("/api/v1/schema/?format=json").json()
    operation = document["paths"]["/api/v1/prompts/{prompt_id}/cancel/"]["post"]
    assert operation["operationId"] == "prompts_cancel"
    assert {"200", "401", "403", "404", "409"} <= set(operation["responses"])


def test_a_worker_cancelled_during_its_model_call_does_nothing_more(
    worker: CeleryWorker, fake_llm: FakeLLM, saga: Saga, alice: User, client_for: Callable[[User], APIClient]
) -> None:
    calling, answer = threading.Event(), threading.Event()

    def tester(body: dict[str, Any]) -> dict[str, Any]:
        calling.set()
        answer.wait(timeout=60)
        return say("", tool_call("finish", {"result": "Tested."}))

    fake_llm.rule("tester-m", tester)
    client = client_for(alice)
    prompt_id = submit(client, saga, prompt="Test it.", brain="fake", team=["tester"])["prompt_id"]
    assert calling.wait(timeout=60), "the tester's model call never came"

    assert client.post(f"/api/v1/prompts/{prompt_id}/cancel/").status_code == 200
    answer.set()
    wait_until(lambda: "is another worker's; stopping" in worker.log(), what="the tester's turn to find itself ended")

    prompt = Prompt.objects.get(pk=prompt_id)
    assert (prompt.status, prompt.reason, prompt.final_answer, prompt.results) == (
        "failed", "Cancelled by human:alice.", "", []
    )  # fmt: skip
    assert statuses(saga, prompt) == {"lead": "failed", "tester": "cancelled"}
    assert len(fake_llm.calls_for("tester-m")) == 1
    assert not JournalEvent.objects.filter(saga=saga, type__in=["llm_call", "worker_end", "prompt.completed"]).exists()
