"""Caps on what one agent or one saga could otherwise multiply: delegates, unanswered forms and HTTP
waits in progress, each refused at the boundary with a stable code (429)."""

import time
from types import SimpleNamespace

import pytest
from django.conf import LazySettings
from redis import Redis

from accounts.models import User
from journal.models import JournalEvent
from sagas import errors, waits
from sagas.actions import NewAgent, add_agent, add_agents, answer_human_request, ask_human
from sagas.models import AgentRequest, Collaborator, HumanRequest
from sagas.waits import hold_wait
from tests.sagas.api_http import client_for, problem
from tests.sagas.conftest import MakeTeam
from tests.sagas.kernel import Team

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fast_passwords")]

FORM = [{"name": "ok", "type": "boolean"}]


def delegate(team: Team, by: str, name: str) -> Collaborator:
    collaborator, _ = add_agent(
        saga=team.saga, name=name, role="r", task="t", runtime="external", by=team.user(by), parent=f"agent:{by}"
    )
    return collaborator


# --- delegates -----------------------------------------------------------------------------------


def test_an_agent_adds_delegates_up_to_its_cap(team: Team, alice: User, settings: LazySettings) -> None:
    settings.AGORA_MAX_DELEGATES_PER_AGENT = 3  # coder already has tester
    delegate(team, "coder", "d1")
    delegate(team, "coder", "d2")
    with pytest.raises(errors.TooManyDelegates) as refused:
        delegate(team, "coder", "d3")
    assert (refused.value.code, refused.value.status) == ("too_many_delegates", 429)
    # A manager cannot add past it either; another agent has its own budget.
    with pytest.raises(errors.TooManyDelegates):
        add_agent(saga=team.saga, name="d4", role="r", task="t", runtime="external", by=alice, parent="agent:coder")
    delegate(team, "reviewer", "r1")
    assert not Collaborator.objects.filter(saga=team.saga, name__in=["d3", "d4"]).exists()


def test_agents_added_at_once_must_all_fit_under_the_cap(team: Team, settings: LazySettings) -> None:
    settings.AGORA_MAX_DELEGATES_PER_AGENT = 3  # coder already has tester: two more fit, not three
    three = [NewAgent(name=f"batch{i}", role="r", task="t", runtime="external") for i in range(3)]
    with pytest.raises(errors.TooManyDelegates):
        add_agents(saga=team.saga, agents=three, by=team.user("coder"), parent="agent:coder")
    assert not Collaborator.objects.filter(saga=team.saga, name__startswith="batch").exists()  # none of them

    added = add_agents(saga=team.saga, agents=three[:2], by=team.user("coder"), parent="agent:coder")

    assert [c.handle for c, _ in added] == ["agent:batch0", "agent:batch1"]
    assert all(token for _, token in added)  # external agents get their token, once
    with pytest.raises(errors.NameTaken, match="agent:batch1"):  # a name taken (or twice in one call): none added
        add_agents(saga=team.saga, agents=[three[2], three[1]], by=team.user("lead"), parent="agent:lead")
    with pytest.raises(errors.NameTaken, match="agent:x"):
        x = NewAgent(name="x", role="r", task="t", runtime="external")
        add_agents(saga=team.saga, agents=[x, x], by=team.user("lead"), parent="agent:lead")
    assert not Collaborator.objects.filter(saga=team.saga, name__in=["batch2", "x"]).exists()


def test_a_saga_holds_agents_up_to_its_cap(team: Team, alice: User, settings: LazySettings) -> None:
    settings.AGORA_MAX_AGENTS_PER_SAGA = 6  # the team has 5
    delegate(team, "lead", "sixth")
    with pytest.raises(errors.TooManyDelegates):
        delegate(team, "scout", "seventh")
    with pytest.raises(errors.TooManyDelegates):
        add_agent(saga=team.saga, name="seventh", role="r", task="t", runtime="external", by=alice)


def test_the_delegate_cap_over_the_api(team: Team, settings: LazySettings) -> None:
    settings.AGORA_MAX_DELEGATES_PER_AGENT = 1  # coder already has tester
    api = client_for(team.user("coder"), "Bearer")
    response = api.post(f"/api/v1/sagas/{team.saga.pk}/collaborators/", {"kind": "agent", "name": "more"},
                        format="json")  # fmt: skip
    assert problem(response, 429, "too_many_delegates")["limit"] == 1


# --- forms ---------------------------------------------------------------------------------------


def test_an_agent_keeps_open_forms_up_to_its_cap_and_an_answer_frees_one(
    team: Team, bob: User, settings: LazySettings
) -> None:
    settings.AGORA_MAX_OPEN_FORMS_PER_AGENT = 2
    first, _ = ask_human(asker=team["coder"], title="One", fields=FORM, to="human:bob")
    ask_human(asker=team["coder"], title="Two", fields=FORM, to="human:bob")
    with pytest.raises(errors.TooManyPending) as refused:
        ask_human(asker=team["coder"], title="Three", fields=FORM, to="human:bob")
    assert (refused.value.code, refused.value.status) == ("too_many_pending", 429)
    # The same idempotency key still answers with its form at the cap; another agent is not held.
    ask_human(asker=team["lead"], title="Lead's", fields=FORM)
    answer_human_request(human_request_id=first.pk, answer={"ok": True}, by=bob)
    ask_human(asker=team["coder"], title="Three", fields=FORM, to="human:bob")
    assert HumanRequest.objects.filter(asker=team["coder"], status="pending").count() == 2


def test_a_saga_keeps_open_forms_up_to_its_cap(team: Team, settings: LazySettings) -> None:
    settings.AGORA_MAX_OPEN_FORMS_PER_SAGA = 2
    ask_human(asker=team["coder"], title="One", fields=FORM)
    ask_human(asker=team["lead"], title="Two", fields=FORM)
    with pytest.raises(errors.TooManyPending):
        ask_human(asker=team["tester"], title="Three", fields=FORM)


def test_a_replayed_form_is_returned_at_the_cap(team: Team, settings: LazySettings) -> None:
    settings.AGORA_MAX_OPEN_FORMS_PER_AGENT = 1
    first, _ = ask_human(asker=team["coder"], title="One", fields=FORM, idempotency_key="k")
    again, created = ask_human(asker=team["coder"], title="One", fields=FORM, idempotency_key="k")
    assert (again.pk, created) == (first.pk, False)


def test_the_form_cap_over_the_api(team: Team, settings: LazySettings) -> None:
    settings.AGORA_MAX_OPEN_FORMS_PER_AGENT = 0
    api = client_for(team.user("coder"), "Bearer")
    response = api.post(f"/api/v1/sagas/{team.saga.pk}/human-requests/", {"title": "T", "fields": FORM},
                        format="json")  # fmt: skip
    problem(response, 429, "too_many_pending")
    assert not HumanRequest.objects.exists()


# --- waits in progress ---------------------------------------------------------------------------


def test_waits_are_held_up_to_the_agent_cap_and_released(team: Team, settings: LazySettings) -> None:
    settings.AGORA_MAX_WAITS_PER_AGENT = 2
    held = [hold_wait(team["coder"]), hold_wait(team["coder"])]
    with pytest.raises(errors.TooManyWaits) as refused:
        hold_wait(team["coder"])
    assert (refused.value.code, refused.value.status) == ("too_many_waits", 429)
    hold_wait(team["lead"]).release()  # another agent's budget
    held[0].release()
    held[0].release()  # twice is once
    hold_wait(team["coder"])
    with pytest.raises(errors.TooManyWaits):
        hold_wait(team["coder"])


def test_waits_are_held_up_to_the_saga_cap(make_team: MakeTeam, settings: LazySettings) -> None:
    settings.AGORA_MAX_WAITS_PER_SAGA = 2
    team, other = make_team(), make_team(title="Other")
    hold_wait(team["coder"])
    hold_wait(team["lead"])
    with pytest.raises(errors.TooManyWaits):
        hold_wait(team["tester"])
    hold_wait(other["tester"])  # another saga's budget


def test_a_slot_whose_process_died_lapses(team: Team, settings: LazySettings, redis_url: str) -> None:
    settings.AGORA_MAX_WAITS_PER_AGENT = 1
    slot = hold_wait(team["coder"])
    with Redis.from_url(redis_url) as client:  # as if its wait began long ago and its process died
        for key in slot.keys:
            client.zadd(key, {slot.member: time.time() - 1})
    hold_wait(team["coder"])


def test_a_wait_over_the_cap_is_refused_before_anything_is_written(team: Team, settings: LazySettings) -> None:
    settings.AGORA_MAX_WAITS_PER_AGENT = 1
    held = hold_wait(team["coder"])
    api = client_for(team.user("coder"), "Bearer")
    body = {"to": "agent:lead", "type": "plan", "payload": {}, "mode": "wait", "timeout_s": 1}
    problem(api.post(f"/api/v1/sagas/{team.saga.pk}/requests/", body, format="json"), 429, "too_many_waits")
    assert not AgentRequest.objects.exists()
    problem(api.get("/api/v1/steering/?wait=1"), 429, "too_many_waits")
    assert api.get("/api/v1/steering/?wait=0").status_code == 200  # not a wait: not counted
    body["mode"] = "async"
    assert api.post(f"/api/v1/sagas/{team.saga.pk}/requests/", body, format="json").status_code == 202
    held.release()
    # A wait that ends gives its slot back: two long-polls in a row both run.
    assert api.get("/api/v1/steering/?wait=0.05").status_code == 200
    assert api.get("/api/v1/steering/?wait=0.05").status_code == 200


def test_a_long_poll_takes_a_slot_only_to_wait_and_before_it_acknowledges(team: Team, settings: LazySettings) -> None:
    """The cursor a long-poll acknowledges is a write (items read, requests delivered): a poll
    refused for its wait acknowledges nothing; one that finds items at once needs no slot."""
    tester, coder = client_for(team.user("tester"), "Bearer"), client_for(team.user("coder"), "Bearer")
    asks = f"/api/v1/sagas/{team.saga.pk}/requests/"
    first = tester.post(asks, {"to": "agent:coder", "type": "x", "payload": {}}, format="json").data["request_id"]
    (item,) = coder.get("/api/v1/steering/").data["items"]
    settings.AGORA_MAX_WAITS_PER_AGENT = 1
    held = hold_wait(team["coder"])

    problem(coder.get(f"/api/v1/steering/?after={item['seq']}&wait=5"), 429, "too_many_waits")

    assert AgentRequest.objects.get(pk=first).status == "pending"
    assert not JournalEvent.objects.filter(saga=team.saga, type="request.delivered").exists()
    tester.post(asks, {"to": "agent:coder", "type": "y", "payload": {}}, format="json")
    found = coder.get(f"/api/v1/steering/?after={item['seq']}&wait=5")  # at its cap still: nothing to wait for
    assert [i["type"] for i in found.data["items"]] == ["y"] and AgentRequest.objects.get(pk=first).status != "pending"
    held.release()
    hold_wait(team["coder"]).release()  # and it held none


def test_a_renewed_wait_is_counted_past_its_first_lapse(
    team: Team, settings: LazySettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wait with no end of its own (an A2A stream) renews its slot: a lapsed slot no longer counts,
    so without renewal a stream older than the lapse would let the cap be passed."""
    settings.AGORA_MAX_WAITS_PER_AGENT = 1
    now = [time.time()]
    monkeypatch.setattr(waits, "time", SimpleNamespace(time=lambda: now[0], monotonic=time.monotonic))
    stream, plain = hold_wait(team["coder"]), hold_wait(team["lead"])
    now[0] += stream.lapse_s - 1
    stream.renew()
    now[0] += 2  # past the first lapse of both
    with pytest.raises(errors.TooManyWaits):
        hold_wait(team["coder"])  # the renewed one still counts
    hold_wait(team["lead"])  # the one not renewed lapsed: its place is free
    plain.release()
