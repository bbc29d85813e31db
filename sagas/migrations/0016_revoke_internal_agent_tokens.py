from typing import Any

from django.db import migrations


def revoke_internal_agent_tokens(apps: Any, schema_editor: Any) -> None:
    """A manager could once rotate an internal agent's token (refused since, in
    sagas/actions/tokens.py), and whoever held it acted as the agent Agora runs. An internal agent
    has no other way to a token (only external agents get one when they join): every token of an
    internal agent's service user goes."""
    ApiToken = apps.get_model("accounts", "ApiToken")
    Collaborator = apps.get_model("sagas", "Collaborator")
    internal = Collaborator.objects.filter(runtime="internal").values("user_id")
    ApiToken.objects.filter(user_id__in=internal).delete()


class Migration(migrations.Migration):
    dependencies = [("accounts", "0001_initial"), ("sagas", "0015_run_reclaims_in_row")]

    # Nothing to put back: a revoked token's key was never stored.
    operations = [migrations.RunPython(revoke_internal_agent_tokens, migrations.RunPython.noop)]
