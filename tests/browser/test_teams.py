"""The Teams card in a real Chromium: the roster and the lead's inbox follow the kernel live."""

import pytest
from playwright.sync_api import expect

from accounts.models import User
from sagas import actions
from sagas.models import Saga
from tests.browser.conftest import Browse, django_calls
from tests.browser.test_dashboard import external_agent, open_saga
from tests.sagas.kernel import profile_named

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def saga(alice: User) -> Saga:
    return actions.create_saga(title="Migrate the API", goal="Ship v2 without breaking clients.", owner=alice)


def test_the_team_view_follows_spawns_answers_and_shutdowns_without_reload(
    browse: Browse, alice: User, saga: Saga
) -> None:
    page = browse.as_user(alice)
    open_saga(page, saga)
    page.evaluate("window.sameDocument = true")
    expect(page.locator("#part-teams")).to_contain_text("No team yet.")

    with django_calls():
        lead = external_agent(saga, "lead", by=alice)
        for name in ("ann", "ben"):
            actions.spawn_teammate(
                lead=lead, name=name, role="Researcher", prompt=f"{name}'s survey", profile=profile_named("mate"),
                by=lead.user,
            )  # fmt: skip
    team = page.locator('#part-teams [data-team="agent:lead"]')
    expect(team.locator('[data-teammate="agent:ann"]')).to_have_attribute("data-status", "working")
    expect(team.locator('[data-teammate="agent:ben"]')).to_contain_text("ben's survey")

    with django_calls():
        ann = actions.find_collaborator(saga, "agent:ann")
        assert ann is not None
        actions.ask_agent(sender=ann, to="agent:lead", type="team.report", payload={"found": "three clients"})
    expect(team.locator("[data-unread]")).to_have_attribute("data-unread", "1")
    expect(team.locator(".team-inbox")).to_contain_text("team.report")

    with django_calls():
        actions.shutdown_teammate(teammate=ann, reason="Survey done.", by=alice)
    expect(team.locator('[data-teammate="agent:ann"]')).to_have_attribute("data-status", "shutdown")
    expect(team.locator('[data-teammate="agent:ben"]')).to_have_attribute("data-status", "working")
    assert page.evaluate("window.sameDocument") is True  # no reload happened
