"""The data migration that revokes internal agents' tokens, run on rows the current models write."""

import importlib

from django.apps import apps
from rest_framework.test import APIClient

from accounts.actions import issue_token
from accounts.models import ApiToken, User
from sagas import actions
from tests.sagas.api_http import problem
from tests.sagas.kernel import profile_named

revoking = importlib.import_module("sagas.migrations.0016_revoke_internal_agent_tokens")


def bearer(key: str) -> APIClient:
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    return api


def test_tokens_issued_to_internal_agents_stop_working(alice: User) -> None:
    """A manager could once rotate an internal agent's token, and act as the agent Agora runs (drain
    its steering, ask as it): the migration takes every such token away, and only those."""
    saga = actions.create_saga(title="t", owner=alice)
    inside, _ = actions.add_agent(saga=saga, name="inside", role="R", task="t", runtime="internal",
                                  profile=profile_named("inside"), by=alice)  # fmt: skip
    outside, key = actions.add_agent(saga=saga, name="outside", role="R", task="t", runtime="external", by=alice)
    taken = issue_token(user=inside.user)  # what such a rotation left
    issue_token(user=alice)
    assert key is not None and bearer(taken).get("/api/v1/steering/").status_code == 200

    revoking.revoke_internal_agent_tokens(apps, None)

    problem(bearer(taken).get("/api/v1/steering/"), 401, "authentication_failed")
    assert not ApiToken.objects.filter(user=inside.user).exists()
    assert bearer(key).get("/api/v1/steering/").status_code == 200
    assert ApiToken.objects.filter(user__in=[outside.user, alice]).count() == 2
