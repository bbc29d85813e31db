"""Numeric query parameters accept ASCII digits only, in one helper (`config.params`), on every view
that reads one: a Unicode digit such as `²` ("²".isdigit() is true, int("²") fails) is a 400
`invalid_payload` naming the parameter, never a 500."""

import pytest
from django.test import Client

from accounts.models import User
from config.params import InvalidParameter, integer_param, seconds_param
from gateways.mcp import operations as mcp
from sagas import errors
from sagas.actions import ask_agent
from tests.sagas.api_http import client_for, problem
from tests.sagas.kernel import Team, unread

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fast_passwords")]

# Superscript two, Arabic-Indic digits (int() takes them), fullwidth one, a sign, spaces, a
# fraction, an exponent, underscores (int() takes them) and a number no database column holds.
BAD = ["%C2%B2", "%D9%A1%D9%A2", "%EF%BC%91", "-1", "+1", "%201", "1.5", "1e3", "1_000", "99999999999999999999"]


@pytest.mark.parametrize("raw", ["²", "١٢", "\uff11", "-1", "+1", " 1", "1 ", "1.5", "1e3", "1_000", "1\n", str(2**63)])
def test_the_helper_takes_ascii_digits_only(raw: str) -> None:
    with pytest.raises(InvalidParameter) as refused:
        integer_param({"after": raw}, "after", default=0)
    assert refused.value.code == "invalid_payload" and refused.value.extra == {"errors": {"after": [
        "An integer of at least 0, in ASCII digits."]}}  # fmt: skip


def test_the_helper_reads_good_values_and_defaults() -> None:
    assert integer_param({"after": "42"}, "after", default=0) == 42
    assert integer_param({"after": str(2**63 - 1)}, "after", default=0) == 2**63 - 1
    assert integer_param({}, "after", default=7) == 7 and integer_param({"after": ""}, "after", default=7) == 7
    with pytest.raises(InvalidParameter):
        integer_param({"limit": "0"}, "limit", default=5, minimum=1)
    assert seconds_param({"wait": "0.5"}, "wait") == 0.5 and seconds_param({}, "wait") == 0
    for raw in ("²", "nan", "inf", "-1", "1e3", "\uff11"):
        with pytest.raises(InvalidParameter):
            seconds_param({"wait": raw}, "wait")


@pytest.mark.parametrize("raw", BAD)
def test_the_journal_api_and_its_export_refuse_a_bad_cursor(team: Team, alice: User, raw: str) -> None:
    api = client_for(alice)
    for path in (f"/api/v1/sagas/{team.saga.pk}/journal/", f"/api/v1/sagas/{team.saga.pk}/journal.jsonl"):
        body = problem(api.get(f"{path}?after={raw}"), 400, "invalid_payload")
        assert "after" in body["errors"]
    body = problem(api.get(f"/api/v1/sagas/{team.saga.pk}/journal/?limit={raw}"), 400, "invalid_payload")
    assert "limit" in body["errors"]


@pytest.mark.parametrize("raw", BAD)
def test_the_steering_feed_refuses_a_bad_cursor_or_wait(team: Team, raw: str) -> None:
    api = client_for(team.user("coder"), "Bearer")
    assert "after" in problem(api.get(f"/api/v1/steering/?after={raw}"), 400, "invalid_payload")["errors"]
    if raw != "1.5":  # a wait may be a fraction of a second
        assert "wait" in problem(api.get(f"/api/v1/steering/?wait={raw}"), 400, "invalid_payload")["errors"]
    assert api.get("/api/v1/steering/?after=0&wait=0").status_code == 200


def test_the_steering_feed_and_the_mcp_tool_refuse_a_cursor_past_the_newest_item(team: Team) -> None:
    ask_agent(sender=team["lead"], to="agent:coder", type="ping", payload={})
    api = client_for(team.user("coder"), "Bearer")

    assert "after" in problem(api.get("/api/v1/steering/?after=2"), 400, "invalid_payload")["errors"]
    with pytest.raises(errors.InvalidPayload):
        mcp.read_steering(team.user("coder"), after=2)

    assert [i.seq for i in unread(team["coder"])] == [1]  # acknowledged nothing
    assert [i["seq"] for i in api.get("/api/v1/steering/?after=0").json()["items"]] == [1]


@pytest.mark.parametrize("raw", BAD)
def test_the_dashboard_refuses_a_bad_cursor(team: Team, alice: User, raw: str) -> None:
    browser = Client()
    browser.force_login(alice)
    for url in (
        f"/sagas/{team.saga.pk}/?before={raw}",
        f"/sagas/{team.saga.pk}/journal/?after={raw}",
        f"/sagas/{team.saga.pk}/journal/?before={raw}",
    ):
        response = browser.get(url)
        assert response.status_code == 400, url
        assert response.content.decode().startswith("invalid_payload"), url
    assert browser.get(f"/sagas/{team.saga.pk}/journal/?after=0").status_code == 200
    assert browser.get(f"/sagas/{team.saga.pk}/?before=3").status_code == 200
