"""The saga page's prompt box and plan view, server-rendered (readable without JavaScript), and the
live part the page's script re-fetches."""

import json
from pathlib import Path

import pytest
from django.test import Client

from accounts.models import User
from agents.actions import load_profiles
from agents.orchestrator.actions import load_brains
from agents.orchestrator.models import Prompt
from sagas import actions
from sagas.models import Saga
from tests.support import CeleryWorker, wait_until

ROOT = Path(__file__).resolve().parents[2] / "agents"


@pytest.fixture
def default_brain(transactional_db: None) -> None:
    load_profiles(entries=json.loads((ROOT / "profiles" / "brain.json").read_text()))
    load_brains(entries=json.loads((ROOT / "brains" / "default.json").read_text()))


def page_client(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_prompt_box_starts_an_orchestration_and_the_plan_view_shows_it(
    worker: CeleryWorker, default_brain: None, saga: Saga, alice: User
) -> None:
    client = page_client(alice)
    page = client.get(f"/sagas/{saga.pk}/").content.decode()
    assert 'id="prompt-form"' in page and "No prompt yet." in page

    response = client.post(f"/sagas/{saga.pk}/prompts/", {"prompt": "Migrate the orders API to a cursor."})
    assert response.status_code == 302 and response["Location"].endswith(f"/sagas/{saga.pk}/#prompts")
    prompt = Prompt.objects.get(saga=saga)
    wait_until(lambda: Prompt.objects.get(pk=prompt.pk).status == "completed", timeout=60, what="the orchestration")

    for html in (client.get(f"/sagas/{saga.pk}/").content.decode(),
                 client.get(f"/sagas/{saga.pk}/live/prompts/").content.decode()):  # fmt: skip
        assert f'data-prompt="{prompt.pk}" data-status="completed"' in html
        for role in ("researcher", "tester", "writer"):
            assert f'data-role="{role}" data-status="completed"' in html
        assert "Twelve cases" in html  # the tester's summary
        assert 'data-step="primary" data-status="completed"' in html and "opaque cursor" in html
        assert 'data-decision="approve"' in html
    # After the saga ends (no action ends one yet: its row is set), the plan view stays; the box goes.
    Saga.objects.filter(pk=saga.pk).update(status=Saga.Status.COMPLETED)
    html = client.get(f"/sagas/{saga.pk}/").content.decode()
    assert f'data-prompt="{prompt.pk}" data-status="completed"' in html and 'id="prompt-form"' not in html
    # The panel says which journal events refresh it.
    assert (
        'data-events="prompt.,plan.,primary.,review.,worker_,run."' in client.get(f"/sagas/{saga.pk}/").content.decode()
    )


def test_people_who_do_not_manage_get_no_prompt_box_and_cannot_submit(
    default_brain: None, saga: Saga, alice: User, bob: User, mallory: User
) -> None:
    actions.add_human(saga=saga, user=bob, role="Analyst", task="Watch", by=alice)
    page = page_client(bob).get(f"/sagas/{saga.pk}/").content.decode()
    assert 'id="prompts"' in page and 'id="prompt-form"' not in page
    assert page_client(bob).post(f"/sagas/{saga.pk}/prompts/", {"prompt": "Do it"}).status_code == 403
    assert page_client(mallory).post(f"/sagas/{saga.pk}/prompts/", {"prompt": "Do it"}).status_code == 404
    assert not Prompt.objects.exists()


def test_a_rejected_prompt_says_why(default_brain: None, saga: Saga, alice: User) -> None:
    client = page_client(alice)
    response = client.post(f"/sagas/{saga.pk}/prompts/", {"prompt": "   "}, follow=True)
    assert "Prompt not submitted" in response.content.decode()
    assert not Prompt.objects.exists()
