"""The dashboard in a real Chromium against the real app (daphne, Redis channel layer, a Celery
worker where one matters): sign in, live events, forms, steering, reconnects, outsiders."""

import re
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.utils import timezone
from playwright.sync_api import Page, Route, expect

from accounts.models import User
from journal.actions import record
from sagas import actions
from sagas.models import Collaborator, HumanRequest, Saga, SteeringItem
from tests.browser.conftest import Browse, django_calls
from tests.support import CeleryWorker, WebServer, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def saga(alice: User) -> Saga:
    return actions.create_saga(title="Migrate the API", goal="Ship v2 without breaking clients.", owner=alice)


def external_agent(saga: Saga, name: str, *, by: User, parent: str | None = None) -> Collaborator:
    agent, _ = actions.add_agent(
        saga=saga, name=name, role=name.title(), task=f"{name}'s part", runtime="external", parent=parent, by=by
    )
    return agent


def open_saga(page: Page, saga: Saga) -> None:
    """Open the saga page and wait until its journal socket is live."""
    response = page.goto(f"/sagas/{saga.pk}/")
    assert response is not None and response.status == 200
    expect(page.locator("#live-status")).to_have_attribute("data-state", "live")


def timeline_row(page: Page, seq: int) -> Any:
    return page.locator(f'#timeline li[data-seq="{seq}"]')


def test_sign_in_and_out(browse: Browse, alice: User, saga: Saga) -> None:
    page = browse.anonymous()
    page.goto("/")
    expect(page).to_have_url(re.compile(r"/accounts/login/\?next=/$"))

    page.get_by_label("Username").fill("alice")
    page.get_by_label("Password").fill("not-her-password")
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("alert")).to_contain_text("do not match")

    page.get_by_label("Username").fill("alice")
    page.get_by_label("Password").fill("alice-password")
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Sagas", exact=True)).to_be_visible()
    page.get_by_role("link", name="Migrate the API").click()
    expect(page.get_by_role("heading", name="Migrate the API")).to_be_visible()
    expect(page.locator("#live-status")).to_have_attribute("data-state", "live")

    page.get_by_role("button", name="Sign out").click()
    expect(page).to_have_url(re.compile(r"/accounts/login/$"))
    page.goto(f"/sagas/{saga.pk}/")
    expect(page).to_have_url(re.compile(r"/accounts/login/\?next="))


def test_kernel_events_appear_on_an_open_page_without_reload(
    browse: Browse, celery_worker: CeleryWorker, alice: User, saga: Saga
) -> None:
    page = browse.as_user(alice)
    open_saga(page, saga)
    page.evaluate("window.sameDocument = true")

    # actions called here, committed: the page hears of them over the socket
    with django_calls():
        lead = external_agent(saga, "lead", by=alice)
        coder = external_agent(saga, "coder", by=alice, parent="agent:lead")
    expect(page.locator('#part-team [data-handle="agent:coder"]')).to_have_attribute("data-status", "idle")
    expect(page.locator('#part-roster [data-roster="idle"] [data-handle="agent:lead"]')).to_be_visible()
    with django_calls():
        request, _ = actions.ask_agent(
            sender=lead, to="agent:coder", type="code.plan", payload={"scope": "billing"}, mode="wait", timeout_s=0.5
        )
    row = page.locator(f'#part-requests [data-request="{request.pk}"]')
    expect(row).to_have_attribute("data-status", "pending")
    expect(row).to_contain_text("wait")
    expect(page.locator('#timeline li[data-type="request.created"]')).to_contain_text("asked agent:coder")

    # the Celery worker (another process) ends the wait once its deadline has passed
    deadline = request.wait_deadline
    assert deadline is not None
    wait_until(lambda: timezone.now() > deadline, what="the wait deadline")
    celery_worker.app.send_task("sagas.tasks.reconcile")
    expect(page.locator('#timeline li[data-type="request.wait_timed_out"]')).to_have_count(1)

    with django_calls():
        actions.reply_to_request(request_id=request.pk, by=coder.user, payload={"steps": 3})
    expect(row).to_have_attribute("data-status", "completed")
    expect(row).to_contain_text('{"steps": 3}')

    with django_calls():
        last = saga.journal_events.count()
    expect(timeline_row(page, last)).to_be_visible()
    expect(page.locator("#part-stats")).to_contain_text(str(last))
    assert page.evaluate("window.sameDocument") is True  # no reload happened


def test_rows_and_parts_the_server_failed_to_send_are_fetched_again(browse: Browse, alice: User, saga: Saga) -> None:
    page = browse.as_user(alice)
    open_saga(page, saga)
    with django_calls():
        lead = external_agent(saga, "lead", by=alice)
        external_agent(saga, "coder", by=alice, parent="agent:lead")
    expect(page.locator('#part-team [data-handle="agent:coder"]')).to_be_visible()

    # from now on, the first fetch of new timeline rows and of the requests part each get a 503,
    # as from a proxy while the app restarts
    refused: list[str] = []

    def unavailable_once(route: Route) -> None:
        path = urlsplit(route.request.url).path
        if path in refused:
            route.continue_()
        else:
            refused.append(path)
            route.fulfill(status=503, body="restarting")

    page.route(re.compile(r"/(journal|live/requests)/(\?.*)?$"), unavailable_once)
    with django_calls():
        request, _ = actions.ask_agent(sender=lead, to="agent:coder", type="code.plan", payload={"scope": "billing"})
        last = saga.journal_events.count()
    expect(page.locator(f'#part-requests [data-request="{request.pk}"]')).to_have_attribute("data-status", "pending")
    expect(timeline_row(page, last)).to_contain_text("asked agent:coder")
    assert sorted(refused) == sorted([f"/sagas/{saga.pk}/journal/", f"/sagas/{saga.pk}/live/requests/"])


def test_a_person_answers_a_form_and_the_asking_agent_receives_it(
    browse: Browse, alice: User, bob: User, saga: Saga
) -> None:
    actions.add_human(saga=saga, user=bob, role="Analyst", task="Usage data", by=alice)
    scout = external_agent(saga, "scout", by=alice)
    page = browse.as_user(bob)
    open_saga(page, saga)
    expect(page.locator("[data-inbox-empty]")).to_be_visible()

    with django_calls():
        form, _ = actions.ask_human(
            asker=scout,
            to="human:bob",
            title="Usage of v1",
            fields=[
                {"name": "clients", "label": "Clients still on v1", "type": "integer"},
                {"name": "region", "label": "Busiest region", "type": "choice", "choices": ["eu", "us"]},
                {"name": "notes", "label": "Notes", "type": "textarea", "required": False},
            ],
        )
    card = page.locator(f'[data-form-id="{form.pk}"]')
    expect(card).to_be_visible()  # arrived live

    card.get_by_label("Clients still on v1").fill("a dozen")
    card.get_by_label("eu").check()
    card.get_by_role("button", name="Send answer").click()
    card = page.locator(f'[data-form-id="{form.pk}"]')
    expect(card.locator('[data-field="clients"] .field-error')).to_have_text("Enter a whole number.")
    expect(card.get_by_label("Clients still on v1")).to_have_value("a dozen")
    expect(card.get_by_label("eu")).to_be_checked()
    with django_calls():
        assert HumanRequest.objects.get(pk=form.pk).status == HumanRequest.Status.PENDING

    card.get_by_label("Clients still on v1").fill("12")
    card.get_by_role("button", name="Send answer").click()
    expect(page.locator(".flash")).to_contain_text("Answer sent to agent:scout.")
    expect(page.locator(f'[data-form-id="{form.pk}"]')).to_have_count(0)
    expect(page.locator(f'[data-answered="{form.pk}"]')).to_be_attached()

    with django_calls():
        received = SteeringItem.objects.get(recipient=scout, kind=SteeringItem.Kind.HUMAN_RESPONSE)
    assert received.payload == {"clients": 12, "region": "eu"}
    assert (received.sender, received.human_request_id) == ("human:bob", form.pk)


def test_a_steering_message_typed_in_the_page_reaches_the_agent(browse: Browse, alice: User, saga: Saga) -> None:
    external_agent(saga, "lead", by=alice)
    coder = external_agent(saga, "coder", by=alice, parent="agent:lead")
    page = browse.as_user(alice)
    open_saga(page, saga)

    steer = page.locator("#steer-form")
    steer.get_by_label("To").select_option("agent:coder")
    steer.get_by_label("Message").fill("Start with the /invoices endpoints.")
    steer.get_by_role("button", name="Send message").click()
    expect(page.locator(".flash")).to_contain_text("Message queued for agent:coder")
    expect(page.locator('#timeline li[data-type="steering.message"]')).to_contain_text("sent a message to agent:coder")

    with django_calls():
        item = SteeringItem.objects.get(recipient=coder, kind=SteeringItem.Kind.MESSAGE)
        drained = actions.consume_steering(recipient=coder)  # what the agent's next read takes
    assert (item.payload, item.sender) == ("Start with the /invoices endpoints.", "human:alice")
    assert [(i.kind, i.payload) for i in drained] == [("message", "Start with the /invoices endpoints.")]


def test_after_the_socket_drops_no_event_is_missing_or_duplicated(
    browse: Browse, web_server: WebServer, alice: User, saga: Saga
) -> None:
    def note(i: int) -> int:
        with django_calls():
            return record(saga_id=saga.pk, type="note", actor="agent:probe", data={"i": i}).seq

    before_open = [note(i) for i in range(60)]  # more than a page: the oldest come in by "load older"
    page = browse.as_user(alice)
    open_saga(page, saga)
    expect(page.locator("#timeline li[data-seq]")).to_have_count(50)
    for i in range(60, 63):
        last = note(i)
    expect(timeline_row(page, last)).to_be_visible()

    # the page's socket closes; events happen while it is down
    page.evaluate("agoraLive.drop({hold: true})")
    expect(page.locator("#live-status")).to_have_attribute("data-state", "offline")
    for i in range(63, 68):
        last = note(i)
    assert page.evaluate("agoraLive.state.socket") is None
    page.evaluate("agoraLive.release()")
    expect(timeline_row(page, last)).to_be_visible()

    # the server itself goes away and comes back; events happen while it is down, and after
    web_server.stop()
    expect(page.locator("#live-status")).to_have_attribute("data-state", "connecting")
    for i in range(68, 71):
        last = note(i)
    web_server.start()
    expect(page.locator("#live-status")).to_have_attribute("data-state", "live", timeout=30_000)
    for i in range(71, 73):
        last = note(i)
    expect(timeline_row(page, last)).to_be_visible()

    page.locator("#load-older").click()  # the rest of the journal, below the live rows
    expect(page.locator("#load-older")).to_have_count(0)
    with django_calls():
        total = saga.journal_events.count()
    assert total == before_open[-1] + 13
    expect(page.locator("#timeline li[data-seq]")).to_have_count(total)
    shown = page.evaluate("agoraLive.seqs()")
    assert shown == list(range(total, 0, -1))  # each seq once, newest first, none missing
    assert page.evaluate("agoraLive.state.connects") >= 3


PROBE = """async ([sagaId, paths]) => {
  const socket = await new Promise((resolve) => {
    const got = [];
    const ws = new WebSocket(`ws://${location.host}/ws/sagas/${sagaId}/journal/?after=0`);
    ws.onmessage = (m) => got.push(JSON.parse(m.data).event.seq);
    ws.onopen = () => setTimeout(() => { ws.close(); resolve({opened: true, got}); }, 500);
    ws.onclose = (e) => resolve({opened: false, code: e.code, got});
  });
  const statuses = {};
  for (const path of paths) {
    const response = await fetch(path, {credentials: "same-origin"});
    statuses[path] = [response.status, (await response.text()).includes("Migrate the API")];
  }
  return {socket, statuses};
}"""


def test_an_outsider_gets_no_page_no_socket_and_no_data(browse: Browse, alice: User, mallory: User, saga: Saga) -> None:
    external_agent(saga, "lead", by=alice)
    paths = [
        f"/sagas/{saga.pk}/journal/?after=0",
        f"/sagas/{saga.pk}/live/team/",
        f"/sagas/{saga.pk}/live/inbox/",
        f"/sagas/{saga.pk}/live/requests/",
        f"/api/v1/sagas/{saga.pk}/journal.jsonl",
    ]

    outsider = browse.as_user(mallory)
    response = outsider.goto(f"/sagas/{saga.pk}/")
    assert response is not None and response.status == 404
    expect(outsider.locator("body")).not_to_contain_text("Migrate the API")
    outsider.goto("/")
    expect(outsider.locator("main")).not_to_contain_text("Migrate the API")
    probe = outsider.evaluate(PROBE, [str(saga.pk), paths])
    assert probe["socket"]["opened"] is False and probe["socket"]["got"] == []
    assert probe["statuses"] == {path: [404, False] for path in paths}

    # the same probe as the owner gets everything: the refusals above are about who asks
    owner = browse.as_user(alice)
    owner.goto("/")
    probe = owner.evaluate(PROBE, [str(saga.pk), paths])
    assert probe["socket"]["opened"] is True
    with django_calls():
        total = saga.journal_events.count()
    assert probe["socket"]["got"] == list(range(1, total + 1))
    assert all(status == 200 for status, _ in probe["statuses"].values())
