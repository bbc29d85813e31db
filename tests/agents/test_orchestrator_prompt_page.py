"""A prompt's page of its own: the saga page shows the latest plan views and links to the older
prompts, whose pages keep their plan views readable, also after the saga ends; for anyone who may
see the saga, and nobody else."""

from django.test import Client

from accounts.models import User
from agents.orchestrator.actions import submit_prompt
from agents.orchestrator.models import Prompt
from agents.orchestrator.views import PROMPTS_SHOWN
from sagas import actions
from sagas.models import Saga
from tests.agents.orchestration_support import page_client


def test_older_prompts_are_listed_and_each_has_a_readable_page(default_brain: None, saga: Saga, alice: User) -> None:
    prompts = [submit_prompt(saga=saga, by=alice, text=f"Task number {i}.")[0] for i in range(PROMPTS_SHOWN + 2)]
    oldest = prompts[0]
    plan = {"primary_role": "coder", "workers": [{"role": "tester", "goal": "Cover page two.", "reason": "tests"}],
            "requires_review": False, "source": "router", "reason": "code"}  # fmt: skip
    Prompt.objects.filter(pk=oldest.pk).update(
        plan=plan, step=Prompt.Step.DONE, status=Prompt.Status.COMPLETED, answer="Done it.",
        final_answer="Done it, with a cursor." + " And more." * 300,
        results=[{"role": "tester", "status": "completed", "summary": "Twelve cases pass.", "risks": [],
                  "artifacts": []}],
    )  # fmt: skip
    client = page_client(alice)

    for html in (client.get(f"/sagas/{saga.pk}/").content.decode(),
                 client.get(f"/sagas/{saga.pk}/live/prompts/").content.decode()):  # fmt: skip
        assert html.count('<article class="plan-view"') == PROMPTS_SHOWN
        older = html.split('id="older-prompts"', 1)[1]
        assert 'data-older="2"' in html and "older prompts (2)" in older
        for prompt in prompts[:2]:
            assert f'href="/sagas/{saga.pk}/prompts/{prompt.pk}/"' in older
            assert f'<article class="plan-view" data-prompt="{prompt.pk}"' not in html
        # Each plan view links to its own page.
        assert f'href="/sagas/{saga.pk}/prompts/{prompts[-1].pk}/" data-permalink' in html
    # A long final answer is cut on the saga page, whole on the prompt's (the third's, still shown).
    long = "Long. " * 500
    Prompt.objects.filter(pk=prompts[2].pk).update(plan=plan, status=Prompt.Status.COMPLETED, final_answer=long)
    shown = client.get(f"/sagas/{saga.pk}/live/prompts/").content.decode()
    assert shown.count("Long.") < 400 and f'href="/sagas/{saga.pk}/prompts/{prompts[2].pk}/" data-whole' in shown
    assert client.get(f"/sagas/{saga.pk}/prompts/{prompts[2].pk}/").content.decode().count("Long.") == 500

    Saga.objects.filter(pk=saga.pk).update(status=Saga.Status.COMPLETED)  # no action ends one yet
    page = client.get(f"/sagas/{saga.pk}/prompts/{oldest.pk}/")
    assert page.status_code == 200
    html = page.content.decode()
    assert f'<article class="plan-view" data-prompt="{oldest.pk}" data-status="completed">' in html
    assert "Cover page two." in html and "Twelve cases pass." in html and "Done it, with a cursor." in html
    assert html.count("And more.") == 300 and "data-whole" not in html
    assert html.count('<article class="plan-view"') == 1 and "Still running" not in html
    assert "Still running" in client.get(f"/sagas/{saga.pk}/prompts/{prompts[-1].pk}/").content.decode()


def test_a_prompt_page_is_only_for_those_who_may_see_its_saga(
    default_brain: None, saga: Saga, alice: User, bob: User, mallory: User
) -> None:
    prompt, _ = submit_prompt(saga=saga, by=alice, text="Only for the team.")
    other = actions.create_saga(title="Elsewhere", owner=alice)
    actions.add_human(saga=saga, user=bob, role="Analyst", task="Watch", by=alice)

    assert "Only for the team." in page_client(bob).get(f"/sagas/{saga.pk}/prompts/{prompt.pk}/").content.decode()
    assert page_client(mallory).get(f"/sagas/{saga.pk}/prompts/{prompt.pk}/").status_code == 404
    assert page_client(alice).get(f"/sagas/{other.pk}/prompts/{prompt.pk}/").status_code == 404  # not that saga's
    assert Client().get(f"/sagas/{saga.pk}/prompts/{prompt.pk}/").status_code == 302  # to sign in
