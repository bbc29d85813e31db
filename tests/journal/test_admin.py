"""The journal admin is for inspection only: it lists, filters, searches and shows, and changes nothing."""

import pytest
from django.test import Client

from accounts.models import User
from config.sql import flush
from journal.actions import record
from journal.models import JournalEvent
from sagas.actions import create_saga
from sagas.models import Saga

pytestmark = pytest.mark.django_db

LIST = "/admin/journal/journalevent/"


@pytest.fixture
def event(saga: Saga) -> JournalEvent:
    event = record(
        saga_id=saga.pk, type="request.sent", actor="agent:coder", run_id="run-7", data={"to": "agent:qa", "n": 1}
    )
    flush()  # its id and seq come back with the deferred statements
    return event


def listed_pks(client: Client, query: str = "") -> set[int]:
    response = client.get(f"{LIST}{query}")
    assert response.status_code == 200
    return {row.pk for row in response.context["cl"].result_list}


def test_the_list_renders_with_its_filters(admin_client: Client, alice: User, event: JournalEvent) -> None:
    create_saga(title="A second saga", owner=alice)  # a filter with a single choice is not shown

    response = admin_client.get(LIST)

    assert response.status_code == 200
    page = response.content.decode()
    assert "request.sent" in page and "agent:coder" in page
    filter_titles = {spec.title for spec in response.context["cl"].filter_specs}
    assert {"type", "actor", "created at", "saga"} <= filter_titles


def test_filters_and_search_narrow_the_list(admin_client: Client, alice: User, saga: Saga, event: JournalEvent) -> None:
    other = create_saga(title="Unrelated work", owner=alice)
    elsewhere = record(saga_id=other.pk, type="note", actor="agent:writer")
    flush()

    assert listed_pks(admin_client, "?type=request.sent") == {event.pk}
    assert listed_pks(admin_client, "?actor=agent:writer") == {elsewhere.pk}
    assert listed_pks(admin_client, f"?saga__id__exact={other.pk}") == set(
        JournalEvent.objects.filter(saga=other).values_list("pk", flat=True)
    )
    assert listed_pks(admin_client, "?q=run-7") == {event.pk}
    assert listed_pks(admin_client, f"?q={other.pk}") == set(
        JournalEvent.objects.filter(saga=other).values_list("pk", flat=True)
    )
    created = event.created_at
    day = f"?created_at__year={created.year}&created_at__month={created.month}&created_at__day={created.day}"
    assert event.pk in listed_pks(admin_client, day)
    assert listed_pks(admin_client, "?created_at__year=1999") == set()


def test_the_detail_page_shows_pretty_json_read_only(admin_client: Client, event: JournalEvent) -> None:
    response = admin_client.get(f"{LIST}{event.pk}/change/")

    assert response.status_code == 200
    page = response.content.decode()
    assert "<pre>{\n  &quot;n&quot;: 1,\n  &quot;to&quot;: &quot;agent:qa&quot;\n}</pre>" in page
    assert 'name="_save"' not in page  # no save button: the view is read-only
    assert "request.sent" in page


def test_adding_is_forbidden(admin_client: Client, saga: Saga) -> None:
    before = JournalEvent.objects.count()

    assert admin_client.get(f"{LIST}add/").status_code == 403
    response = admin_client.post(f"{LIST}add/", {"saga": str(saga.pk), "seq": 99, "type": "forged", "data": "{}"})

    assert response.status_code == 403
    assert JournalEvent.objects.count() == before


def test_posting_a_change_does_not_alter_the_event(admin_client: Client, event: JournalEvent) -> None:
    response = admin_client.post(
        f"{LIST}{event.pk}/change/",
        {"saga": str(event.saga_id), "seq": 99, "type": "forged", "actor": "agent:mallory", "data": "{}"},
    )

    assert response.status_code == 403
    stored = JournalEvent.objects.get(pk=event.pk)
    assert (stored.seq, stored.type, stored.actor, stored.data) == (
        event.seq,
        "request.sent",
        "agent:coder",
        {"to": "agent:qa", "n": 1},
    )


def test_deleting_is_forbidden(admin_client: Client, event: JournalEvent) -> None:
    assert admin_client.get(f"{LIST}{event.pk}/delete/").status_code == 403
    assert admin_client.post(f"{LIST}{event.pk}/delete/", {"post": "yes"}).status_code == 403
    assert JournalEvent.objects.filter(pk=event.pk).exists()


def test_there_is_no_delete_selected_action(admin_client: Client, event: JournalEvent) -> None:
    response = admin_client.get(LIST)
    assert "delete_selected" not in response.content.decode()
    assert response.context["action_form"] is None

    before = JournalEvent.objects.count()
    admin_client.post(LIST, {"action": "delete_selected", "_selected_action": [str(event.pk)], "post": "yes"})

    assert JournalEvent.objects.count() == before
