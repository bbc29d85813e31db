"""Finishing a saga in the kernel, over REST and on the dashboard: who may, what bad input gets,
what it closes, and that a finished saga refuses new work even to a caller holding an old copy.
(Through a real worker, with teams at work: tests/agents/test_saga_finish.py.)"""

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from accounts.models import User
from journal.models import JournalEvent
from sagas import actions, errors
from sagas.actions.locking import lock_open_saga
from sagas.models import AgentRequest, HumanRequest, Run, Saga
from tests.sagas.api_http import client_for, problem
from tests.sagas.kernel import Team, events_of, reads

pytestmark = pytest.mark.usefixtures("fast_passwords")


def finish_url(team: Team) -> str:
    return f"/api/v1/sagas/{team.saga.pk}/finish/"


def event_count(team: Team) -> int:
    return JournalEvent.objects.filter(saga=team.saga).count()


def signed_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_only_managers_finish_a_saga_and_a_refusal_changes_nothing(
    team: Team, alice: User, bob: User, mallory: User
) -> None:
    before = event_count(team)
    body = {"status": "cancelled", "reason": "Not needed"}
    problem(client_for(bob).post(finish_url(team), body, format="json"), 403, "forbidden")
    problem(client_for(team.user("lead"), "Bearer").post(finish_url(team), body, format="json"), 403, "forbidden")
    problem(client_for(mallory).post(finish_url(team), body, format="json"), 404, "not_found")
    with pytest.raises(errors.Forbidden):
        actions.finish_saga(saga=team.saga, status="cancelled", by=bob)

    team.saga.refresh_from_db()
    assert team.saga.status == Saga.Status.OPEN and event_count(team) == before
    assert not Run.objects.filter(collaborator__saga=team.saga, status=Run.Status.CANCELLED).exists()


def test_bad_input_is_refused_before_anything_is_written(team: Team, alice: User) -> None:
    before = event_count(team)
    owner = client_for(alice)
    for body in ({}, {"status": "open"}, {"status": "done"}, {"status": "completed", "reason": 7}):
        assert "status" in str(problem(owner.post(finish_url(team), body, format="json"), 400, "invalid_payload"))
    with pytest.raises(errors.InvalidPayload):
        actions.finish_saga(saga=team.saga, status="open", by=alice)
    with pytest.raises(errors.InvalidPayload):
        actions.finish_saga(saga=team.saga, status="completed", reason="x" * 100_000, by=alice)
    team.saga.refresh_from_db()
    assert team.saga.status == Saga.Status.OPEN and event_count(team) == before


def test_finishing_closes_what_is_open_and_stays_final(team: Team, alice: User, bob: User) -> None:
    lead, coder = team["lead"], team["coder"]
    asked, _ = actions.ask_agent(sender=coder, to="agent:lead", type="t", payload={})
    form, _ = actions.ask_human(asker=lead, title="OK?", fields=[{"name": "ok", "type": "boolean"}], to="human:bob")

    saga = actions.finish_saga(saga=team.saga, status="cancelled", reason="Out of scope", by=alice)

    assert saga.status == Saga.Status.CANCELLED
    assert set(Run.objects.filter(collaborator__saga=saga).values_list("status", flat=True)) == {"cancelled"}
    asked.refresh_from_db()
    assert asked.status == AgentRequest.Status.RECIPIENT_UNAVAILABLE
    assert HumanRequest.objects.get(pk=form.pk).status == HumanRequest.Status.CANCELLED
    (withdrawn,) = events_of(saga, "human_request.cancelled")
    assert withdrawn.data == {"human_request_id": form.pk} and withdrawn.actor == "human:alice"
    # The addressee learns the form was withdrawn, not that someone else answered it.
    answer = client_for(bob).post(f"/api/v1/human-requests/{form.pk}/answer/", {"answer": {"ok": True}}, format="json")
    assert "withdrawn" in problem(answer, 409, "request_closed")["detail"]
    # What ends work still answers as it always has (not saga_finished); what starts work does not.
    with pytest.raises(errors.RequestClosed):
        actions.cancel_request(request_id=asked.pk, by=coder.user)
    with pytest.raises(errors.SagaFinished):
        actions.steer(saga=saga, to=lead, message="hi", by=alice)
    assert actions.finish_saga(saga=saga, status="cancelled", by=alice).status == Saga.Status.CANCELLED
    with pytest.raises(errors.SagaFinished):
        actions.finish_saga(saga=saga, status="completed", by=alice)
    assert len(events_of(saga, "saga.finished")) == 1


def test_a_caller_holding_a_copy_from_before_the_finish_is_refused_too(team: Team, alice: User) -> None:
    """An orchestration step holds the saga it read before its router call: the lock it takes
    with that copy must not let it start work on a saga finished meanwhile."""
    stale = Saga.objects.get(pk=team.saga.pk)
    actions.finish_saga(saga=team.saga, status="completed", by=alice)
    with actions.saga_transaction(stale), pytest.raises(errors.SagaFinished):
        actions.add_agent(saga=stale, name="late", role="R", task="t", runtime="external", by=alice)
    assert not team.saga.collaborators.filter(name="late").exists()
    # An ask reads the status with the rest of what it decides on.
    lead = team["lead"]
    with actions.saga_transaction(stale), pytest.raises(errors.SagaFinished) as refused:
        actions.ask_agent(sender=lead, to="agent:coder", type="ping", payload={})
    assert refused.value.extra == {"saga_status": Saga.Status.COMPLETED}
    assert not AgentRequest.objects.filter(saga=team.saga, status=AgentRequest.Status.PENDING).exists()


def test_only_a_copy_not_known_current_has_its_status_read_again(team: Team) -> None:
    """A turn's transaction says its copy is current (it proves its run's lease under the lock,
    and finishing the saga ends every run): the writes that start work read nothing more there.
    Another copy has the status read again: on PostgreSQL by the statement that takes the lock
    (its answer comes back with it), elsewhere by one more read."""
    with CaptureQueriesContext(connection) as current, actions.saga_transaction(team.saga, current=True):
        lock_open_saga(team.saga.pk)
    with CaptureQueriesContext(connection) as other, actions.saga_transaction(team.saga):
        lock_open_saga(team.saga.pk)
    assert reads(current) == []
    assert len(reads(other)) == (0 if connection.vendor == "postgresql" else 1)


def test_the_dashboard_finishes_a_saga_without_javascript(team: Team, alice: User, bob: User) -> None:
    page = reverse("sagas:detail", args=[team.saga.pk])
    url = reverse("sagas:finish", args=[team.saga.pk])
    owner = signed_in(alice)
    html = owner.get(page).content.decode()
    assert 'id="finish-form"' in html and f'action="{url}"' in html and 'name="status"' in html
    assert 'id="finish-form"' not in signed_in(bob).get(page).content.decode()
    assert signed_in(bob).post(url, {"status": "completed"}).status_code == 403

    bad = owner.post(url, {"status": "later", "reason": "x"})
    assert bad.status_code == 400 and "completed or cancelled." in bad.content.decode()
    team.saga.refresh_from_db()
    assert team.saga.status == Saga.Status.OPEN

    done = owner.post(url, {"status": "completed", "reason": "Shipped"}, follow=True)
    assert done.redirect_chain[-1] == (page, 302)
    html = done.content.decode()
    assert "This saga is completed" in html and "its agents and teams have stopped" in html
    assert 'id="finish-form"' not in html and 'id="steer-form"' not in html and 'id="add-agent-form"' not in html
    assert "finished the saga: completed · Shipped" in html  # the journal's line for it
    team.saga.refresh_from_db()
    assert team.saga.status == Saga.Status.COMPLETED

    # A page left open elsewhere: the other status, or a form posted to the finished saga.
    again = owner.post(url, {"status": "cancelled"}, follow=True)
    assert "already completed" in again.content.decode()
    late = owner.post(reverse("sagas:add-agent", args=[team.saga.pk]), {"name": "late", "runtime": "external"})
    assert late.status_code == 400 and "it takes no new work" in late.content.decode()
    team.saga.refresh_from_db()
    assert team.saga.status == Saga.Status.COMPLETED and not team.saga.collaborators.filter(name="late").exists()
