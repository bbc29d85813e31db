from django.db import migrations

# The tokens each team's teammates have stored in their transcripts so far: the total their turns
# add to from now on (sagas.actions.count_team_tokens). Plain SQL that both databases run.
COUNT = (
    "UPDATE sagas_team SET tokens_used = (SELECT COALESCE(SUM(e.tokens), 0) FROM agents_transcriptentry e "
    "JOIN sagas_run r ON r.id = e.run_id WHERE r.team_id = sagas_team.id)"
)


class Migration(migrations.Migration):
    dependencies = [("agents", "0007_step_moved"), ("sagas", "0011_team_tokens_used")]

    operations = [migrations.RunSQL(COUNT, reverse_sql=migrations.RunSQL.noop)]
