"""The dashboard's pages through the Django test client: what each person sees, and what they may do."""

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import pytest
from django.db import connection
from django.db.models import Model
from django.test import Client
from django.urls import reverse

from accounts.models import User
from config.params import FORM_SENT
from journal.actions import record
from sagas import actions
from sagas.models import AgentRequest, Collaborator, HumanRequest, Run, Saga, SteeringItem
from tests.sagas.kernel import outcomes, profile_named, run_concurrently

pytestmark = pytest.mark.django_db

FORM_FIELDS = [
    {"name": "count", "label": "How many clients still call v1?", "type": "integer"},
    {"name": "deadline", "label": "Cut-over date", "type": "date"},
    {"name": "notify", "label": "Notify them?", "type": "boolean"},
    {"name": "channel", "label": "Channel", "type": "choice", "choices": ["email", "slack"], "required": False},
]


@dataclass
class Cast:
    saga: Saga
    lead: Collaborator
    coder: Collaborator
    request: AgentRequest
    form: HumanRequest


@pytest.fixture
def cast(alice: User, bob: User) -> Cast:
    """Alice's saga: agent:lead and its delegate agent:coder (external), bob as an analyst, one
    request from lead to coder, and a form from coder waiting for alice."""
    saga = actions.create_saga(title="Migrate the API", goal="Ship v2", owner=alice)
    lead, _ = actions.add_agent(saga=saga, name="lead", role="Lead", task="Plan it", runtime="external", by=alice)
    coder, _ = actions.add_agent(
        saga=saga, name="coder", role="Coder", task="Write it", runtime="external", parent="agent:lead", by=alice
    )
    actions.add_human(saga=saga, user=bob, role="Analyst", task="Requirements", by=alice)
    request, _ = actions.ask_agent(sender=lead, to="agent:coder", type="code.plan", payload={"scope": "billing"})
    form, _ = actions.ask_human(asker=coder, title="Usage of v1", fields=FORM_FIELDS)
    return Cast(saga=saga, lead=lead, coder=coder, request=request, form=form)


def client_for(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def page_url(saga: Saga) -> str:
    return reverse("sagas:detail", args=[saga.pk])


def seqs(html: str) -> list[int]:
    return [int(s) for s in re.findall(r'data-seq="(\d+)"', html)]


def field_block(html: str, name: str) -> str:
    """The markup of one answer-form field, up to the next field."""
    match = re.search(rf'data-field="{name}">(.*?)(?=data-field=|</form>)', html, re.S)
    assert match, f"no field {name}"
    return match.group(1)


# --- the list ----------------------------------------------------------------------------------


def test_the_pages_answer_head_as_get(cast: Cast, alice: User, mallory: User) -> None:
    """A monitor's or a link checker's HEAD (RFC 9110: a server supports GET and HEAD) was 405."""
    pages = ["/", page_url(cast.saga), reverse("sagas:part", args=[cast.saga.pk, "team"])]

    assert [client_for(alice).head(url).status_code for url in pages] == [200, 200, 200]
    assert client_for(mallory).head(page_url(cast.saga)).status_code == 404  # and the same rule as GET


def test_list_shows_only_the_sagas_each_person_may_see(cast: Cast, alice: User, bob: User, mallory: User) -> None:
    elsewhere = actions.create_saga(title="Mallory's plot", owner=mallory)

    as_alice = client_for(alice).get("/").content.decode()
    assert "Migrate the API" in as_alice
    assert "Mallory&#x27;s plot" not in as_alice and str(elsewhere.pk) not in as_alice
    assert "Usage of v1" in as_alice  # waiting for her, with a link to the inbox

    as_bob = client_for(bob).get("/").content.decode()
    assert "Migrate the API" in as_bob  # he joined as an analyst
    assert "Usage of v1" not in as_bob  # that form is alice's

    as_mallory = client_for(mallory).get("/").content.decode()
    assert str(elsewhere.pk) in as_mallory
    assert str(cast.saga.pk) not in as_mallory


def test_signed_out_visitors_are_sent_to_sign_in(cast: Cast) -> None:
    response = Client().get(page_url(cast.saga))
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/")
    assert Client().get("/accounts/login/").status_code == 200


def test_creating_a_saga(alice: User) -> None:
    client = client_for(alice)
    rejected = client.post(reverse("sagas:create"), {"title": "  ", "policy": "tree"})
    assert rejected.status_code == 400
    assert "This field may not be blank." in rejected.content.decode()

    response = client.post(reverse("sagas:create"), {"title": "Audit logs", "goal": "Find gaps", "policy": "hub"})
    saga = Saga.objects.get(title="Audit logs")
    assert response.status_code == 302 and response["Location"] == page_url(saga)
    assert (saga.owner, saga.policy, saga.goal) == (alice, "hub", "Find gaps")
    assert Collaborator.objects.filter(saga=saga, user=alice, role="Owner").exists()


def test_the_saga_form_sent_twice_creates_one_saga(alice: User) -> None:
    client = client_for(alice)
    form = re.search(r'name="idempotency_key" value="([0-9a-f]{32})"', client.get("/").content.decode())
    assert form is not None
    sent = {"title": "Audit logs", "goal": "Find gaps", "policy": "hub", "idempotency_key": form[1]}
    answers = [client.post(reverse("sagas:create"), sent) for _ in range(2)]
    (saga,) = Saga.objects.filter(title="Audit logs")
    assert [(a.status_code, a["Location"]) for a in answers] == [(302, page_url(saga))] * 2
    again = client.post(reverse("sagas:create"), {**sent, "title": "Audit metrics"})
    assert again.status_code == 400 and FORM_SENT in again.content.decode()
    assert not Saga.objects.filter(title="Audit metrics").exists()
    other = client_for(alice).get("/").content.decode()  # each render has a key of its own
    assert form[1] not in other and re.search(r'name="idempotency_key" value="[0-9a-f]{32}"', other)


# --- the saga page -----------------------------------------------------------------------------


def test_saga_page_shows_tree_journal_requests_and_inbox(cast: Cast, alice: User) -> None:
    response = client_for(alice).get(page_url(cast.saga))
    assert response.status_code == 200
    html = response.content.decode()

    # the tree: owner first, then lead, with coder nested under it; kinds, roles, statuses, run ids
    order = [html.index(f'data-handle="{h}"') for h in ("human:alice", "agent:lead", "agent:coder")]
    assert order == sorted(order)
    assert re.search(r'data-handle="agent:coder" data-status="idle"', html)
    assert "--depth: 2" in html  # coder sits two levels below alice
    assert cast.coder.run.pk in html and cast.lead.run.pk in html
    assert "Analyst" in html and "Coder" in html

    # the journal, rendered server-side, newest first, every event once
    events = cast.saga.journal_events.count()
    assert seqs(html) == list(range(events, 0, -1))
    assert "asked agent:coder · code.plan · async" in html

    # the requests table
    assert f'data-request="{cast.request.pk}" data-status="pending"' in html
    assert "code.plan" in html

    # the inbox: the form, rendered from its schema
    assert f'data-form-id="{cast.form.pk}"' in html
    assert 'name="field.count"' in html and 'type="date"' in html
    assert 'name="field.notify" value="true"' in html and 'name="field.channel" value="slack"' in html
    assert reverse("sagas:answer", args=[cast.saga.pk, cast.form.pk]) in html

    # manager tools
    assert 'id="steer-form"' in html and 'id="add-agent-form"' in html
    assert reverse("journal-export", args=[cast.saga.pk]) in html


def test_a_collaborator_who_is_not_a_manager_sees_the_saga_but_not_the_tools(cast: Cast, bob: User) -> None:
    html = client_for(bob).get(page_url(cast.saga)).content.decode()
    assert 'data-handle="human:bob"' in html and 'data-handle="agent:coder"' in html
    assert f'data-form-id="{cast.form.pk}"' not in html  # addressed to alice
    assert f'data-request="{cast.request.pk}"' not in html  # requests are for their parties and managers
    assert 'id="steer-form"' not in html and 'id="add-agent-form"' not in html
    assert reverse("journal-export", args=[cast.saga.pk]) not in html


def test_an_outsider_gets_404_for_everything_under_the_saga(cast: Cast, mallory: User) -> None:
    client = client_for(mallory)
    saga_id = cast.saga.pk
    gets = [
        page_url(cast.saga),
        reverse("sagas:journal", args=[saga_id]) + "?after=0",
        reverse("journal-export", args=[saga_id]),
        *(reverse("sagas:part", args=[saga_id, part]) for part in ("team", "requests", "inbox", "workers", "stats")),
    ]
    for url in gets:
        response = client.get(url)
        assert response.status_code == 404, url
        assert b"Migrate the API" not in response.content
    posts = {
        reverse("sagas:answer", args=[saga_id, cast.form.pk]): {"field.count": "3"},
        reverse("sagas:steer", args=[saga_id]): {"to": "agent:coder", "message": "psst"},
        reverse("sagas:add-agent", args=[saga_id]): {"name": "mole", "runtime": "external"},
        reverse("sagas:add-person", args=[saga_id]): {"username": "mallory"},
    }
    for url, data in posts.items():
        assert client.post(url, data).status_code == 404, url
    assert not SteeringItem.objects.filter(payload="psst").exists()
    assert not Collaborator.objects.filter(saga=cast.saga, name__in=["mole", "mallory"]).exists()
    assert HumanRequest.objects.get(pk=cast.form.pk).status == "pending"


def test_live_parts_and_journal_pages(cast: Cast, alice: User) -> None:
    client = client_for(alice)
    saga_id = cast.saga.pk
    for _ in range(60):
        record(saga_id=saga_id, type="note", actor="agent:lead", data={"text": "thinking"})
    total = cast.saga.journal_events.count()

    html = client.get(page_url(cast.saga)).content.decode()
    assert seqs(html) == list(range(total, total - 50, -1))  # the newest page
    assert f'href="?before={total - 49}#journal"' in html  # "load older", which works without JS

    older = client.get(page_url(cast.saga), {"before": total - 49}).content.decode()
    assert seqs(older) == list(range(total - 50, 0, -1))
    assert 'data-live="0"' in older  # an older window does not stream

    rows = client.get(reverse("sagas:journal", args=[saga_id]), {"after": total - 3})
    assert seqs(rows.content.decode()) == [total - 2, total - 1, total] and rows["X-More"] == "0"
    rows = client.get(reverse("sagas:journal", args=[saga_id]), {"before": total - 49})
    assert seqs(rows.content.decode())[0] == total - 50
    assert client.get(reverse("sagas:journal", args=[saga_id])).status_code == 400

    Run.objects.filter(collaborator=cast.coder).update(worker="w2@host-b")
    team = client.get(reverse("sagas:part", args=[saga_id, "team"])).content.decode()
    assert 'data-handle="agent:coder"' in team and "<html" not in team
    assert re.search(r'data-handle="agent:coder".*?class="muted small run-worker"[^>]*>on w2@host-b<', team, re.S)
    inbox = client.get(reverse("sagas:part", args=[saga_id, "inbox"])).content.decode()
    assert f'data-form-id="{cast.form.pk}"' in inbox and "csrfmiddlewaretoken" in inbox
    requests = client.get(reverse("sagas:part", args=[saga_id, "requests"])).content.decode()
    assert f'data-request="{cast.request.pk}"' in requests
    roster = client.get(reverse("sagas:part", args=[saga_id, "roster"])).content.decode()
    assert re.search(r'data-roster="idle">.*data-handle="agent:lead"', roster, re.S)
    assert client.get(reverse("sagas:part", args=[saga_id, "nope"])).status_code == 404


@contextmanager
def committed_after_first_read(model: type[Model], change: Callable[[], object]) -> Iterator[None]:
    """Commit `change` from another connection right after this connection's first statement
    reading `model`'s table, as a person or agent acting while a page is being rendered would."""
    done: list[Any] = []

    def wrapper(execute: Callable[..., Any], sql: str, *args: Any) -> Any:
        result = execute(sql, *args)
        if not done and model._meta.db_table in sql:
            done.extend(outcomes(run_concurrently(change)))
        return result

    with connection.execute_wrapper(wrapper):
        yield
    assert done and not isinstance(done[0], Exception), done


@pytest.mark.django_db(transaction=True)
def test_a_request_or_form_closing_while_its_part_renders_is_listed_once(cast: Cast, alice: User) -> None:
    client = client_for(alice)
    reply = partial(actions.reply_to_request, request_id=cast.request.pk, by=cast.coder.user, payload={"ok": 1})
    with committed_after_first_read(AgentRequest, reply):
        html = client.get(reverse("sagas:part", args=[cast.saga.pk, "requests"])).content.decode()
    assert html.count(f'data-request="{cast.request.pk}"') == 1

    answer = {"count": 3, "deadline": "2026-12-01", "notify": True}
    close = partial(actions.answer_human_request, human_request_id=cast.form.pk, answer=answer, by=alice)
    with committed_after_first_read(HumanRequest, close):
        html = client.get(reverse("sagas:part", args=[cast.saga.pk, "inbox"])).content.decode()
    assert html.count(f'data-form-id="{cast.form.pk}"') + html.count(f'data-answered="{cast.form.pk}"') == 1


def test_worker_progress_from_runtime_events(cast: Cast, alice: User) -> None:
    run_id = cast.lead.run.pk
    actions.set_external_status(run_id=run_id, status="working", by=cast.lead.user)
    record(saga_id=cast.saga.pk, type="worker_start", actor="agent:lead", run_id=run_id,
           data={"role": "Lead", "task": "Plan it"})  # fmt: skip
    record(saga_id=cast.saga.pk, type="llm_call", actor="agent:lead", run_id=run_id,
           data={"model": "gpt-4.1-mini", "prompt_tokens": 100, "completion_tokens": 20, "tool_calls": []})  # fmt: skip
    html = client_for(alice).get(reverse("sagas:part", args=[cast.saga.pk, "workers"])).content.decode()
    assert 'data-status="running"' in html and "1 model call" in html and "120 tokens" in html

    record(saga_id=cast.saga.pk, type="worker_end", actor="agent:lead", run_id=run_id,
           data={"status": "completed", "result": "planned", "error": ""})  # fmt: skip
    html = client_for(alice).get(reverse("sagas:part", args=[cast.saga.pk, "workers"])).content.decode()
    assert 'data-status="completed"' in html and "planned" in html and 'data-status="running"' not in html


def test_a_run_coming_to_rest_is_journaled_and_shown(alice: User) -> None:
    saga = actions.create_saga(title="Docs", owner=alice)
    writer, _ = actions.add_agent(
        saga=saga, name="writer", role="Writer", task="Docs", runtime="internal", profile=profile_named("writer"),
        by=alice,
    )  # fmt: skip
    run = actions.claim_turn(run_id=writer.run.pk)
    assert run is not None
    record(saga_id=saga.pk, type="worker_start", actor="agent:writer", run_id=run.pk, data={"role": "Writer"})
    actions.end_turn(run=run, turn=run.turn, more=False)

    rest = saga.journal_events.get(type="run.idle")
    assert (rest.actor, rest.run_id, rest.data) == ("agent:writer", run.pk, {"turn": 1})
    html = client_for(alice).get(page_url(saga)).content.decode()
    assert re.search(r'data-roster="idle">.*data-handle="agent:writer"', html, re.S)
    assert "run idle after turn 1" in html
    assert re.search(r'data-worker="[^"]+" data-status="idle"', html)  # no worker_end yet: as its run


# --- answering forms ---------------------------------------------------------------------------


def fields(**values: str) -> dict[str, str]:
    """A form's answer as the page posts it: each input named `field.<name>`."""
    return {f"field.{name}": value for name, value in values.items()}


def test_answer_form_shows_field_errors_then_accepts_once(cast: Cast, alice: User) -> None:
    client = client_for(alice)
    url = reverse("sagas:answer", args=[cast.saga.pk, cast.form.pk])

    rejected = client.post(url, fields(count="a dozen", deadline="2026-02-30"))
    assert rejected.status_code == 400
    html = rejected.content.decode()
    assert "Enter a whole number." in field_block(html, "count")
    assert 'value="a dozen"' in field_block(html, "count")  # what she typed stays
    assert "Enter a date as YYYY-MM-DD." in field_block(html, "deadline")
    assert "This field is required." in field_block(html, "notify")
    assert "field-error" not in field_block(html, "channel")  # optional, left empty
    assert HumanRequest.objects.get(pk=cast.form.pk).status == "pending"

    accepted = client.post(url, fields(count="12", deadline="2026-03-01", notify="true", channel="slack"))
    assert accepted.status_code == 302
    answer = {"count": 12, "deadline": "2026-03-01", "notify": True, "channel": "slack"}
    assert HumanRequest.objects.get(pk=cast.form.pk).answer == answer
    item = SteeringItem.objects.get(recipient=cast.coder, kind=SteeringItem.Kind.HUMAN_RESPONSE)
    assert item.payload == answer and item.sender == "human:alice"

    page = client.get(accepted["Location"]).content.decode()
    assert "Answer sent to agent:coder." in page
    assert f'data-form-id="{cast.form.pk}"' not in page and f'data-answered="{cast.form.pk}"' in page

    again = client.post(url, fields(count="13", deadline="2026-03-02", notify="false"), follow=True)
    assert "was already answered" in again.content.decode()
    assert HumanRequest.objects.get(pk=cast.form.pk).answer == answer


def test_a_form_answered_again_says_so_whatever_is_posted(cast: Cast, alice: User) -> None:
    client = client_for(alice)
    url = reverse("sagas:answer", args=[cast.saga.pk, cast.form.pk])
    assert client.post(url, fields(count="12", deadline="2026-03-01", notify="true")).status_code == 302

    again = client.post(url, fields(count="a dozen"), follow=True)  # does not fit: still, it was answered

    assert "was already answered" in again.content.decode()


def test_a_field_may_be_named_as_the_pages_own_inputs(cast: Cast, alice: User) -> None:
    """Each input is `field.<name>`: a field named `csrfmiddlewaretoken` was posted beside the
    page's token under its name, and the CSRF check read the person's value instead (403)."""
    form, _ = actions.ask_human(asker=cast.coder, title="Token?", to="human:alice",
                                fields=[{"name": "csrfmiddlewaretoken", "type": "text"}])  # fmt: skip
    client = Client(enforce_csrf_checks=True)  # as a browser's post is checked
    client.force_login(alice)
    page = client.get(page_url(cast.saga)).content.decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    assert token is not None and 'name="field.csrfmiddlewaretoken"' in page

    posted = client.post(reverse("sagas:answer", args=[cast.saga.pk, form.pk]),
                         {"csrfmiddlewaretoken": token.group(1), "field.csrfmiddlewaretoken": "my answer"})  # fmt: skip

    assert posted.status_code == 302
    assert HumanRequest.objects.get(pk=form.pk).answer == {"csrfmiddlewaretoken": "my answer"}


def test_only_the_addressee_answers_a_form(cast: Cast, bob: User) -> None:
    url = reverse("sagas:answer", args=[cast.saga.pk, cast.form.pk])
    assert client_for(bob).post(url, fields(count="1", deadline="2026-03-01", notify="true")).status_code == 404
    assert HumanRequest.objects.get(pk=cast.form.pk).status == "pending"


# --- steering and managing ---------------------------------------------------------------------


def test_steering_posts_a_message_to_the_agent(cast: Cast, alice: User, bob: User) -> None:
    url = reverse("sagas:steer", args=[cast.saga.pk])
    response = client_for(alice).post(url, {"to": "agent:coder", "message": "Start with /invoices."})
    assert response.status_code == 302
    item = SteeringItem.objects.get(recipient=cast.coder, kind=SteeringItem.Kind.MESSAGE)
    assert (item.payload, item.sender) == ("Start with /invoices.", "human:alice")
    assert cast.saga.journal_events.filter(type="steering.message", data__to="agent:coder").exists()

    empty = client_for(alice).post(url, {"to": "agent:coder", "message": "  "})
    assert empty.status_code == 400 and "Write a message." in empty.content.decode()
    to_person = client_for(alice).post(url, {"to": "human:bob", "message": "hi"})
    assert to_person.status_code == 400 and "Choose an agent of this saga." in to_person.content.decode()

    assert client_for(bob).post(url, {"to": "agent:coder", "message": "Ignore alice."}).status_code == 403
    assert SteeringItem.objects.filter(recipient=cast.coder, kind=SteeringItem.Kind.MESSAGE).count() == 1


def test_the_steer_form_sent_twice_queues_one_message(cast: Cast, alice: User) -> None:
    url, client = reverse("sagas:steer", args=[cast.saga.pk]), client_for(alice)
    page = client.get(reverse("sagas:detail", args=[cast.saga.pk])).content.decode()
    form = re.search(r'id="steer-form".*?name="idempotency_key" value="([0-9a-f]{32})"', page, re.S)
    assert form is not None
    sent = {"to": "agent:coder", "message": "Start with /invoices.", "idempotency_key": form[1]}
    assert [client.post(url, sent).status_code for _ in range(2)] == [302, 302]
    assert SteeringItem.objects.filter(recipient=cast.coder, kind=SteeringItem.Kind.MESSAGE).count() == 1
    again = client.post(url, {**sent, "message": "Start with /orders."})
    assert again.status_code == 400 and FORM_SENT in again.content.decode()
    assert SteeringItem.objects.filter(recipient=cast.coder, kind=SteeringItem.Kind.MESSAGE).count() == 1


def test_the_add_forms_sent_twice_add_one_collaborator(cast: Cast, alice: User, mallory: User) -> None:
    """A double click on the agent form adds one agent. Its token was in the first answer, which
    the browser replaces with the second: that one says so, and where to get another; the first
    token still works. The person form likewise adds one person."""
    client, base = client_for(alice), page_url(cast.saga)
    page = client.get(base).content.decode()
    keys = {
        form: re.search(rf'id="{form}".*?name="idempotency_key" value="([0-9a-f]{{32}})"', page, re.S)
        for form in ("add-agent-form", "add-person-form")
    }
    agent_key, person_key = (match[1] for match in keys.values() if match is not None)
    sent = {"name": "scout", "role": "Scout", "runtime": "external", "idempotency_key": agent_key}
    first, second = (client.post(reverse("sagas:add-agent", args=[cast.saga.pk]), sent) for _ in range(2))
    token = re.search(r"<code>(agt_[\w-]+)</code>", first.content.decode())
    assert (first.status_code, second.status_code) == (201, 302) and token is not None
    shown = client.get(second["Location"]).content.decode()
    assert "added by this form&#x27;s first submission" in shown and "agt_" not in shown
    assert Collaborator.objects.filter(saga=cast.saga, name="scout").count() == 1
    assert Client().get(f"/api/v1/sagas/{cast.saga.pk}/", HTTP_AUTHORIZATION=f"Bearer {token[1]}").status_code == 200
    other = client.post(reverse("sagas:add-agent", args=[cast.saga.pk]), {**sent, "role": "Spy"})
    assert other.status_code == 400 and FORM_SENT in other.content.decode()

    person = {"username": "mallory", "role": "Reviewer", "idempotency_key": person_key}
    added = [client.post(reverse("sagas:add-person", args=[cast.saga.pk]), person) for _ in range(2)]
    assert [a.status_code for a in added] == [302, 302]
    assert Collaborator.objects.filter(saga=cast.saga, user=mallory).count() == 1
    assert client.get(base).content.decode().count("human:mallory joined as Reviewer") == 1


def test_adding_collaborators_needs_the_manage_permission(cast: Cast, alice: User, bob: User, mallory: User) -> None:
    add_agent = reverse("sagas:add-agent", args=[cast.saga.pk])
    add_person = reverse("sagas:add-person", args=[cast.saga.pk])
    as_alice, as_bob = client_for(alice), client_for(bob)

    external = as_alice.post(
        add_agent, {"name": "scout", "role": "Scout", "runtime": "external", "parent": "agent:lead"}
    )
    assert external.status_code == 201
    assert re.search(r"<code>agt_[\w-]+</code>", external.content.decode())  # its token, shown this once
    scout = Collaborator.objects.get(saga=cast.saga, name="scout")
    assert scout.delegation.delegator == cast.lead

    unknown_profile = as_alice.post(add_agent, {"name": "writer", "runtime": "internal", "profile": "coder"})
    assert unknown_profile.status_code == 400 and "No profile coder" in unknown_profile.content.decode()
    internal = as_alice.post(add_agent, {"name": "writer", "runtime": "internal", "profile": profile_named("coder")})
    assert internal.status_code == 302
    assert Collaborator.objects.get(saga=cast.saga, name="writer").profile == "coder"

    no_profile = as_alice.post(add_agent, {"name": "ghost", "runtime": "internal"})
    assert no_profile.status_code == 400 and "Required." in no_profile.content.decode()
    taken = as_alice.post(add_agent, {"name": "scout", "runtime": "external"})
    assert taken.status_code == 400 and "already in this saga" in taken.content.decode()

    assert as_bob.post(add_agent, {"name": "sneaky", "runtime": "external"}).status_code == 403
    assert as_bob.post(add_person, {"username": "mallory"}).status_code == 403
    assert not Collaborator.objects.filter(saga=cast.saga, name__in=["sneaky", "mallory"]).exists()

    unknown = as_alice.post(add_person, {"username": "nobody"})
    assert unknown.status_code == 400 and "No person signs in as" in unknown.content.decode()
    assert as_alice.post(add_person, {"username": "mallory", "role": "Reviewer"}).status_code == 302
    assert client_for(mallory).get(page_url(cast.saga)).status_code == 200  # now she is in


# --- the admin ---------------------------------------------------------------------------------


def test_admin_pages_render_and_link_to_the_saga(cast: Cast, alice: User) -> None:
    actions.answer_human_request(
        human_request_id=cast.form.pk, answer={"count": 1, "deadline": "2026-03-01", "notify": False}, by=alice
    )
    admin_user = User.objects.create_superuser(username="root", password="root-password")
    client = client_for(admin_user)
    journal_link = f"/admin/journal/journalevent/?saga__id__exact={cast.saga.pk}"
    objects = {
        "saga": cast.saga,
        "collaborator": cast.coder,
        "delegation": cast.coder.delegation,
        "run": cast.coder.run,
        "agentrequest": cast.request,
        "steeringitem": SteeringItem.objects.filter(recipient=cast.coder).first(),
        "humanrequest": cast.form,
    }
    for model, obj in objects.items():
        assert obj is not None
        changelist = client.get(f"/admin/sagas/{model}/")
        assert changelist.status_code == 200, model
        change = client.get(f"/admin/sagas/{model}/{obj.pk}/change/")
        assert change.status_code == 200, model
        body = changelist.content.decode() + change.content.decode()
        assert journal_link in body, model
        assert 'name="_save"' not in change.content.decode(), f"{model} must be read-only"
    assert client.get(journal_link).status_code == 200
    assert client.get("/admin/sagas/steeringitem/?kind__exact=human_response").status_code == 200
    assert client.get("/admin/sagas/agentrequest/?q=code.plan").status_code == 200
    assert client.post(f"/admin/sagas/humanrequest/{cast.form.pk}/change/", {"title": "x"}).status_code == 403
    assert HumanRequest.objects.get(pk=cast.form.pk).title == "Usage of v1"


@pytest.mark.parametrize(
    ("listed", "lookups"),
    [
        *((listed, lookups) for listed in ("journal/journalevent", "sagas/saga", "sagas/agentrequest") for lookups in (
            "created_at__year={0}", "created_at__year=2026&created_at__month={0}",
            "created_at__year=2026&created_at__month=3&created_at__day={0}",
        )),  # their date hierarchies
        # a plain lookup, where there is no hierarchy: every admin list of the project
        *((listed, "created_at__year={0}") for listed in ("sagas/run", "agents/prompt", "agents/transcriptentry",
                                                          "agents/hookresult", "accounts/apitoken")),
        ("accounts/user", "date_joined__year={0}"),
    ],
)  # fmt: skip
def test_an_admin_list_takes_a_number_no_column_holds_as_a_bad_lookup(
    cast: Cast, admin_client: Client, listed: str, lookups: str
) -> None:
    """Twenty digits for a date's part were a 500, where `abc` is the admin's "invalid lookup"
    answer (a redirect to `?e=1`)."""
    listing = admin_client.get(f"/admin/{listed}/?{lookups.format('9' * 20)}")

    assert (listing.status_code, listing["Location"]) == (302, f"/admin/{listed}/?e=1")
