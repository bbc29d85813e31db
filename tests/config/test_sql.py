"""The hot paths' plain statements load the same instances the ORM would."""

from typing import Any

import pytest
from django.db import IntegrityError, connection, models, transaction

from accounts.models import User
from agents.models import TranscriptEntry
from config.sql import columns, fetch, flush, insert, insert_all, py_value, update
from sagas.actions import add_agent, ask_agent, create_saga
from sagas.models import AgentRequest, Collaborator, Run, Saga, SteeringItem

pytestmark = pytest.mark.django_db


def field_values(instance: models.Model) -> dict[str, Any]:
    return {f.attname: getattr(instance, f.attname) for f in instance._meta.concrete_fields}


def test_fetch_loads_what_the_orm_loads(alice: User) -> None:
    saga = create_saga(title="Plain", owner=alice)
    asker, _ = add_agent(saga=saga, name="a", role="A", task="Ask", runtime="external", by=alice)
    add_agent(saga=saga, name="b", role="B", task="Answer", runtime="external", resumable=True, by=alice)
    request, _ = ask_agent(sender=asker, to="agent:b", type="t.x", payload={"n": [1, 2.5, "é"]}, mode="wait")
    sql = (
        f"SELECT {columns(AgentRequest, 'q')}, {columns(Collaborator, 'c')}, {columns(Run, 'r')}, "
        f"{columns(Saga, 's')}, {columns(User, 'u')} FROM {AgentRequest._meta.db_table} q "
        f"JOIN {Collaborator._meta.db_table} c ON c.id = q.recipient_id "
        f"JOIN {Run._meta.db_table} r ON r.collaborator_id = c.id JOIN {Saga._meta.db_table} s ON s.id = q.saga_id "
        f"JOIN {User._meta.db_table} u ON u.id = c.user_id WHERE q.id = %s"
    )

    ((loaded_request, recipient, run, loaded_saga, user),) = fetch(
        sql, [request.pk], AgentRequest, Collaborator, Run, Saga, User
    )

    orm = AgentRequest.objects.select_related("recipient__run", "recipient__user", "saga").get(pk=request.pk)
    for mine, theirs in [
        (loaded_request, orm),
        (recipient, orm.recipient),
        (run, orm.recipient.run),
        (loaded_saga, orm.saga),
        (user, orm.recipient.user),
    ]:
        assert type(mine) is type(theirs)
        assert field_values(mine) == field_values(theirs)
        assert not mine._state.adding
    assert loaded_request.payload == {"n": [1, 2.5, "é"]} and loaded_request.reply is None
    assert loaded_request.wait_deadline is not None and loaded_request.wait_deadline.tzinfo is not None
    assert run.resumable is True and loaded_saga.pk == saga.pk


def test_an_outer_join_without_a_row_loads_none(alice: User) -> None:
    saga = create_saga(title="Plain", owner=alice)
    agent, _ = add_agent(saga=saga, name="a", role="A", task="Wait", runtime="external", by=alice)
    item = insert(
        SteeringItem(recipient=agent, seq=1, kind=SteeringItem.Kind.MESSAGE, sender="human:alice", payload="hi")
    )
    sql = (
        f"SELECT {columns(SteeringItem, 'i')}, {columns(AgentRequest, 'q')} FROM {SteeringItem._meta.db_table} i "
        f"LEFT JOIN {AgentRequest._meta.db_table} q ON q.id = i.request_id WHERE i.id = %s"
    )

    ((loaded, request),) = fetch(sql, [item.pk], SteeringItem, AgentRequest)

    assert request is None
    assert field_values(loaded) == field_values(SteeringItem.objects.get(pk=item.pk))


def test_py_value_makes_what_the_orm_makes_of_a_column(alice: User) -> None:
    saga = create_saga(title="Plain", owner=alice)
    agent, _ = add_agent(saga=saga, name="a", role="A", task="Talk", runtime="external", by=alice)
    message = {"role": "tool", "content": "[1, 2]", "tool_calls": [{"id": "x", "é": None}]}
    entry = TranscriptEntry.objects.create(run=agent.run, seq=1, turn=1, message=message)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT message, created_at FROM {TranscriptEntry._meta.db_table} WHERE id = %s", [entry.pk])
        raw_message, raw_created = cursor.fetchone()

    assert py_value(TranscriptEntry, "message", raw_message) == message
    assert py_value(TranscriptEntry, "created_at", raw_created) == TranscriptEntry.objects.get(pk=entry.pk).created_at
    assert py_value(TranscriptEntry, "created_at", None) is None


def test_update_changes_the_rows_the_orm_filter_finds(alice: User) -> None:
    saga = create_saga(title="Plain", owner=alice)
    agents = [add_agent(saga=saga, name=n, role=n, task="t", runtime="external", by=alice)[0] for n in "abc"]
    ids = [a.run.pk for a in agents]
    later = Run.objects.get(pk=ids[0]).updated_at

    changed = update(Run, {"id": ids[:2], "status": Run.Status.IDLE}, status=Run.Status.RUNNING, lease_until=later)
    missed = update(Run, {"id": ids[2], "status": Run.Status.QUEUED}, status=Run.Status.RUNNING)

    assert (changed, missed) == (2, 0)
    runs = {r.pk: r for r in Run.objects.filter(pk__in=ids)}
    assert [(runs[i].status, runs[i].lease_until) for i in ids] == [
        (Run.Status.RUNNING, later), (Run.Status.RUNNING, later), (Run.Status.IDLE, None)
    ]  # fmt: skip


def test_insert_all_saves_what_bulk_create_saves_and_reads_the_keys_back() -> None:
    mine = [User(username=n, kind=User.Kind.AGENT, email=f"{n}@example.org") for n in ("a1", "a2")]
    theirs = [User(username=n, kind=User.Kind.AGENT, email=f"{n}@example.org") for n in ("b1", "b2")]

    saved = insert_all(mine)
    User.objects.bulk_create(theirs)

    assert saved == mine and all(u.pk is not None and not u._state.adding for u in mine)
    assert [User.objects.get(pk=u.pk).username for u in mine] == ["a1", "a2"]
    differ = {"id", "username", "email", "date_joined"}
    for a, b in zip(mine, theirs, strict=True):
        read = field_values(User.objects.get(pk=a.pk))
        assert read == field_values(a)
        assert {k: v for k, v in read.items() if k not in differ} == {
            k: v for k, v in field_values(User.objects.get(pk=b.pk)).items() if k not in differ
        }


def test_insert_all_later_sets_the_keys_when_the_answer_comes() -> None:
    users = [User(username=n, kind=User.Kind.AGENT) for n in ("c1", "c2")]
    with transaction.atomic():
        insert_all(users, later=True)
        flush()  # what a transaction's next statement or its COMMIT does
        assert [u.pk for u in users] == list(
            User.objects.filter(username__in=["c1", "c2"]).order_by("username").values_list("pk", flat=True)
        )


def test_insert_all_skips_the_rows_in_conflict_when_told() -> None:
    (first,) = insert_all([User(username="a", kind=User.Kind.AGENT, first_name="first")])

    insert_all([User(username=n, kind=User.Kind.AGENT, first_name="again") for n in "ab"], ignore_conflicts=True)

    assert sorted(User.objects.values_list("username", "first_name")) == [("a", "first"), ("b", "again")]
    assert User.objects.get(username="a").pk == first.pk
    with pytest.raises(IntegrityError), transaction.atomic():
        insert_all([User(username="b", kind=User.Kind.AGENT)])
