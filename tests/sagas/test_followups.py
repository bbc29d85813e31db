"""Follow-ups: the sender of an open request adds to it; the recipient reads it as steering."""

import pytest
from django.conf import LazySettings

from accounts.models import User
from journal.models import JournalEvent
from sagas import errors
from sagas.actions import ask_agent, cancel_request, follow_up_request
from sagas.models import SteeringItem
from tests.sagas.kernel import Team

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fast_passwords")]


def test_the_sender_follows_up_its_open_request_once_per_key(team: Team) -> None:
    request, _ = ask_agent(sender=team["lead"], to="agent:coder", type="code.review", payload={"pr": 1})
    lead = team.user("lead")
    item = follow_up_request(request_id=request.pk, by=lead, message={"also": "the tests"}, idempotency_key="k-1")
    again = follow_up_request(request_id=request.pk, by=lead, message={"also": "the tests"}, idempotency_key="k-1")
    other = follow_up_request(request_id=request.pk, by=lead, message="and the docs")
    assert again.pk == item.pk and other.pk != item.pk
    items = SteeringItem.objects.filter(recipient=team["coder"], kind=SteeringItem.Kind.MESSAGE).order_by("seq")
    assert [(i.sender, i.payload) for i in items] == [
        ("agent:lead", {"request_id": request.pk, "message": {"also": "the tests"}, "key": "k-1"}),
        ("agent:lead", {"request_id": request.pk, "message": "and the docs"}),
    ]
    events = JournalEvent.objects.filter(saga=team.saga, type="request.followed_up").order_by("seq")
    assert [(e.actor, e.data["request_id"], e.data["to"]) for e in events] == [
        ("agent:lead", request.pk, "agent:coder"),
        ("agent:lead", request.pk, "agent:coder"),
    ]


def test_only_the_sender_follows_up_and_only_an_open_request(team: Team, alice: User, settings: LazySettings) -> None:
    request, _ = ask_agent(sender=team["lead"], to="agent:coder", type="code.review", payload={"pr": 1})
    with pytest.raises(errors.Forbidden):  # the recipient
        follow_up_request(request_id=request.pk, by=team.user("coder"), message="no")
    with pytest.raises(errors.Forbidden):  # a manager may see it, but it is not hers
        follow_up_request(request_id=request.pk, by=alice, message="no")
    with pytest.raises(errors.NotFound):  # an agent not party to it
        follow_up_request(request_id=request.pk, by=team.user("scout"), message="no")
    settings.AGORA_MAX_PAYLOAD_BYTES = 16
    with pytest.raises(errors.PayloadTooLarge):
        follow_up_request(request_id=request.pk, by=team.user("lead"), message="x" * 100)
    cancel_request(request_id=request.pk, by=team.user("lead"))
    with pytest.raises(errors.RequestCancelled):
        follow_up_request(request_id=request.pk, by=team.user("lead"), message="too late")
    assert not SteeringItem.objects.filter(recipient=team["coder"], kind=SteeringItem.Kind.MESSAGE).exists()
