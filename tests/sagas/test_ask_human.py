"""`ask_human`: typed forms to the people of a saga, answers validated against them, delivered once
to the asking agent; a mechanism of its own, apart from `ask_agent`."""

from typing import Any

import pytest

from accounts.models import User
from sagas import errors
from sagas.actions import answer_human_request, ask_human, claim_turn, end_turn
from sagas.models import AgentRequest, HumanRequest, Run, SteeringItem
from tests.sagas.conftest import MakeTeam
from tests.sagas.kernel import Team, events_of, field_errors, journal, last_seq, outcomes, run_concurrently, steering

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fast_passwords")]

FORM = [
    {"name": "approve", "label": "Approve the change?", "type": "boolean"},
    {"name": "reason", "type": "textarea", "required": False},
    {"name": "budget", "type": "integer"},
    {"name": "risk", "type": "choice", "choices": ["low", "medium", "high"]},
]
GOOD = {"approve": True, "budget": 3, "risk": "low"}


def form(team: Team, to: str | None = "human:bob", fields: Any = None, **options: Any) -> HumanRequest:
    human_request, _ = ask_human(
        asker=team["coder"], title="Sign-off", fields=FORM if fields is None else fields, to=to, **options
    )
    return human_request


# --- the form ----------------------------------------------------------------------------------


def test_ask_human_stores_a_normalised_form_and_journals_it(team: Team) -> None:
    mark = last_seq(team.saga)

    human_request = form(team)

    assert (human_request.status, human_request.addressee, human_request.asker) == (
        "pending",
        team["bob"],
        team["coder"],
    )
    assert human_request.pk.startswith("hreq-")
    assert human_request.fields[0] == {
        "name": "approve", "label": "Approve the change?", "type": "boolean", "required": True, "choices": [],
    }  # fmt: skip
    assert human_request.fields[1]["label"] == "reason" and human_request.fields[1]["required"] is False
    assert human_request.fields[3]["choices"] == ["low", "medium", "high"]
    assert journal(team.saga, after=mark) == [("human_request.created", "agent:coder")]
    [event] = events_of(team.saga, "human_request.created")
    assert (event.run_id, event.data["to"], event.data["human_request_id"]) == (
        team.run("coder").pk, "human:bob", human_request.pk,
    )  # fmt: skip


def test_without_an_addressee_the_form_goes_to_the_owner(team: Team) -> None:
    assert form(team, to=None).addressee == team["alice"]


def test_a_form_is_not_an_agent_request(team: Team) -> None:
    form(team)

    assert not AgentRequest.objects.exists()
    assert not SteeringItem.objects.exists()  # people answer forms; nothing lands in a steering queue


@pytest.mark.parametrize(
    ("fields", "where"),
    [
        ([{"name": "x", "type": "colour"}], "fields[0]"),
        ([{"name": "x"}, {"name": "x", "type": "integer"}], "fields[1]"),
        ([{"name": "pick", "type": "choice"}], "fields[0]"),
        ([{"name": "pick", "type": "multichoice", "choices": "abc"}], "fields[0]"),
        ([{"name": "pick", "type": "choice", "choices": [1, 2]}], "fields[0]"),
        ([{"type": "text"}], "fields[0]"),
        ([{"name": "has space"}], "fields[0]"),
        (["not an object"], "fields[0]"),
        ([], "fields"),
        ({"name": "x"}, "fields"),
        ([{"name": f"f{i}"} for i in range(51)], "fields"),
    ],
)
def test_bad_schemas_are_refused_with_the_field_at_fault(team: Team, fields: Any, where: str) -> None:
    mark = last_seq(team.saga)

    with pytest.raises(errors.InvalidPayload) as refused:
        form(team, fields=fields)

    assert where in field_errors(refused)
    assert not HumanRequest.objects.exists()
    assert last_seq(team.saga) == mark


def test_every_bad_field_is_reported_at_once(team: Team) -> None:
    with pytest.raises(errors.InvalidPayload) as refused:
        form(team, fields=[{"name": "ok"}, {"name": "a", "type": "colour"}, {"name": "b", "type": "choice"}])

    assert set(field_errors(refused)) == {"fields[1]", "fields[2]"}


@pytest.mark.parametrize("title", ["", "   ", "x" * 201])
def test_a_form_needs_a_title(team: Team, title: str) -> None:
    with pytest.raises(errors.InvalidPayload):
        ask_human(asker=team["coder"], title=title, fields=FORM)


def test_forms_go_to_people_of_the_saga_only(team: Team, mallory: User) -> None:
    for to in ("agent:lead", "human:mallory", "human:nobody"):
        with pytest.raises(errors.NotFound):
            form(team, to=to)
    with pytest.raises(errors.Forbidden):
        ask_human(asker=team["bob"], title="People do not ask through forms", fields=FORM)
    assert not HumanRequest.objects.exists()


def test_the_same_idempotency_key_returns_the_first_form(team: Team) -> None:
    first, created = ask_human(asker=team["coder"], title="Sign-off", fields=FORM, idempotency_key="call-1")
    again, created_again = ask_human(asker=team["coder"], title="Sign-off", fields=FORM, idempotency_key="call-1")

    assert (created, created_again, again.pk) == (True, False, first.pk)
    assert HumanRequest.objects.count() == 1
    assert len(events_of(team.saga, "human_request.created")) == 1


@pytest.mark.parametrize(
    "change",
    [{"title": "Sign-off, again"}, {"fields": FORM[:1]}, {"to": "human:alice"}],
    ids=["title", "fields", "addressee"],
)
def test_the_same_idempotency_key_for_another_form_is_a_conflict(team: Team, change: dict[str, Any]) -> None:
    first, _ = ask_human(asker=team["coder"], title="Sign-off", fields=FORM, to="human:bob", idempotency_key="call-1")

    with pytest.raises(errors.IdempotencyConflict):
        ask_human(**{"asker": team["coder"], "title": "Sign-off", "fields": FORM, "to": "human:bob", **change},
                  idempotency_key="call-1")  # fmt: skip

    assert list(HumanRequest.objects.values_list("pk", "title", "addressee__name")) == [(first.pk, "Sign-off", "bob")]
    assert len(events_of(team.saga, "human_request.created")) == 1


# --- answers -----------------------------------------------------------------------------------


def test_a_valid_answer_closes_the_form_and_reaches_the_asker_once(team: Team, bob: User) -> None:
    human_request = form(team)
    mark = last_seq(team.saga)

    answered = answer_human_request(
        human_request_id=human_request.pk, answer={"approve": "yes", "budget": "12", "risk": "high"}, by=bob
    )

    clean = {"approve": True, "budget": 12, "risk": "high"}
    assert (answered.status, answered.answer, answered.answered_by) == ("answered", clean, bob)
    assert answered.answered_at is not None
    [item] = steering(team["coder"])
    assert (item.kind, item.sender, item.human_request_id, item.payload, item.request_id) == (
        "human_response", "human:bob", human_request.pk, clean, None,
    )  # fmt: skip
    assert journal(team.saga, after=mark) == [("human_request.answered", "human:bob")]


def test_the_first_valid_answer_wins(team: Team, bob: User) -> None:
    human_request = form(team)
    answer_human_request(human_request_id=human_request.pk, answer=GOOD, by=bob)
    mark = last_seq(team.saga)

    with pytest.raises(errors.AlreadyAnswered) as refused:
        answer_human_request(human_request_id=human_request.pk, answer={**GOOD, "budget": 99}, by=bob)

    assert refused.value.status == 409
    assert HumanRequest.objects.get(pk=human_request.pk).answer == GOOD
    assert len(steering(team["coder"])) == 1
    assert last_seq(team.saga) == mark


def test_wrong_missing_and_unknown_fields_are_all_reported_and_nothing_is_stored(team: Team, bob: User) -> None:
    human_request = form(team)
    mark = last_seq(team.saga)

    with pytest.raises(errors.InvalidPayload) as refused:
        answer_human_request(
            human_request_id=human_request.pk,
            answer={"approve": "perhaps", "risk": "extreme", "colour": "blue"},  # and no budget
            by=bob,
        )

    assert (refused.value.code, refused.value.status) == ("invalid_payload", 400)
    problems = field_errors(refused)
    assert set(problems) == {"approve", "risk", "colour", "budget"}
    assert problems["budget"] == ["This field is required."]
    assert problems["colour"] == ["Not a field of this form."]
    stored = HumanRequest.objects.get(pk=human_request.pk)
    assert (stored.status, stored.answer, stored.answered_by) == ("pending", None, None)
    assert steering(team["coder"]) == []
    assert last_seq(team.saga) == mark
    # A valid answer after the invalid one is still accepted.
    assert answer_human_request(human_request_id=human_request.pk, answer=GOOD, by=bob).status == "answered"


@pytest.mark.parametrize(
    ("field", "value", "clean"),
    [
        ({"type": "text"}, "fine", "fine"),
        ({"type": "integer"}, -7, -7),
        ({"type": "integer"}, " 42 ", 42),
        ({"type": "number"}, "2.5", 2.5),
        ({"type": "number"}, 3, 3.0),
        ({"type": "boolean"}, False, False),
        ({"type": "boolean"}, "off", False),
        ({"type": "choice", "choices": ["a", "b"]}, "b", "b"),
        ({"type": "multichoice", "choices": ["a", "b", "c"]}, ["a", "c"], ["a", "c"]),
        ({"type": "multichoice", "choices": ["a", "b"]}, "a", ["a"]),
        ({"type": "date"}, "2026-11-29", "2026-11-29"),
        ({"type": "email"}, "ops@example.com", "ops@example.com"),
    ],
)
def test_answers_are_converted_to_the_field_type(
    team: Team, bob: User, field: dict[str, Any], value: Any, clean: Any
) -> None:
    human_request = form(team, fields=[{"name": "v", **field}])

    answered = answer_human_request(human_request_id=human_request.pk, answer={"v": value}, by=bob)

    assert answered.answer == {"v": clean}
    assert HumanRequest.objects.get(pk=human_request.pk).answer == {"v": clean}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ({"type": "text"}, 12),
        ({"type": "text"}, "x" * 10_001),
        ({"type": "integer"}, "twelve"),
        ({"type": "integer"}, 1.5),
        ({"type": "integer"}, True),
        ({"type": "number"}, "NaN"),
        ({"type": "number"}, "inf"),
        ({"type": "number"}, [1]),
        ({"type": "boolean"}, "maybe"),
        ({"type": "boolean"}, 1),
        ({"type": "choice", "choices": ["a"]}, "z"),
        ({"type": "choice", "choices": ["a"]}, ["a"]),
        ({"type": "multichoice", "choices": ["a"]}, ["a", "z"]),
        ({"type": "date"}, "29/11/2026"),
        ({"type": "date"}, 20261129),
        ({"type": "email"}, "not-an-address"),
        ({"type": "email"}, 5),
        ({"type": "email"}, ["ops@example.com"]),
    ],
)
def test_values_of_the_wrong_type_are_field_errors(team: Team, bob: User, field: dict[str, Any], value: Any) -> None:
    human_request = form(team, fields=[{"name": "v", **field}])

    with pytest.raises(errors.InvalidPayload) as refused:
        answer_human_request(human_request_id=human_request.pk, answer={"v": value}, by=bob)

    assert list(field_errors(refused)) == ["v"]
    assert HumanRequest.objects.get(pk=human_request.pk).status == "pending"


@pytest.mark.parametrize("answer", [None, "yes", ["approve"]])
def test_an_answer_is_an_object(team: Team, bob: User, answer: Any) -> None:
    human_request = form(team)

    with pytest.raises(errors.InvalidPayload):
        answer_human_request(human_request_id=human_request.pk, answer=answer, by=bob)


def test_only_the_addressee_answers(team: Team, alice: User, mallory: User) -> None:
    human_request = form(team)  # to bob

    with pytest.raises(errors.Forbidden):
        answer_human_request(human_request_id=human_request.pk, answer=GOOD, by=alice)  # the owner, not the addressee
    with pytest.raises(errors.Forbidden):
        answer_human_request(human_request_id=human_request.pk, answer=GOOD, by=team.user("coder"))  # the asker
    for outsider in (mallory, team.user("lead")):
        with pytest.raises(errors.NotFound):
            answer_human_request(human_request_id=human_request.pk, answer=GOOD, by=outsider)

    assert HumanRequest.objects.get(pk=human_request.pk).status == "pending"
    assert steering(team["coder"]) == []


def test_an_answer_wakes_an_idle_asker(make_team: MakeTeam, bob: User) -> None:
    team = make_team(internal=["coder"])
    run = claim_turn(run_id=team.run("coder").pk)
    assert run is not None
    human_request = form(team)
    assert end_turn(run=run, turn=1, more=False) == Run.Status.IDLE

    answer_human_request(human_request_id=human_request.pk, answer=GOOD, by=bob)

    assert team.run("coder").status == Run.Status.QUEUED


@pytest.mark.django_db(transaction=True)
def test_two_answers_at_once_store_exactly_one(team: Team, bob: User) -> None:
    human_request = form(team)

    results = outcomes(
        run_concurrently(
            lambda: answer_human_request(human_request_id=human_request.pk, answer={**GOOD, "budget": 1}, by=bob),
            lambda: answer_human_request(human_request_id=human_request.pk, answer={**GOOD, "budget": 2}, by=bob),
        )
    )

    assert sorted(type(r).__name__ for r in results) == ["AlreadyAnswered", "HumanRequest"], results
    [winner] = [r for r in results if isinstance(r, HumanRequest)]
    assert HumanRequest.objects.get(pk=human_request.pk).answer == winner.answer
    assert [i.payload for i in steering(team["coder"])] == [winner.answer]
    assert len(events_of(team.saga, "human_request.answered")) == 1
