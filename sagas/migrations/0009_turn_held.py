from django.db import migrations

from config.postgresql.migrations import guard_function


class Migration(migrations.Migration):
    dependencies = [("sagas", "0008_remote_agents")]

    # A turn's transaction proves, with its first statement, that its run's lease is still this
    # worker's: a renewal that finds its row. On PostgreSQL nothing waits for that answer; the
    # server fails the transaction instead when the renewal found no row
    # (sagas.actions.runs.prove_lease), with this SQLSTATE, which the executor reads as a turn lost
    # to another worker.
    operations = [guard_function("agora_turn_held", "renewed", "AG001", "the turn is no longer this worker's")]
