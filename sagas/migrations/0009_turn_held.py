from django.db import migrations

from config.postgresql.migrations import run_on_postgresql

# A turn's transaction proves, with its first statement, that its run's lease is still this
# worker's: a renewal that finds its row. On PostgreSQL nothing waits for that answer; the server
# fails the transaction instead when the renewal found no row (sagas.actions.runs.prove_lease), with
# this SQLSTATE, which the executor reads as a turn lost to another worker.
CREATE = """
CREATE OR REPLACE FUNCTION agora_turn_held(renewed bigint) RETURNS bigint AS $$
BEGIN
    IF renewed = 0 THEN
        RAISE EXCEPTION 'the turn is no longer this worker''s' USING ERRCODE = 'AG001';
    END IF;
    RETURN renewed;
END;
$$ LANGUAGE plpgsql;
"""
DROP = "DROP FUNCTION IF EXISTS agora_turn_held(bigint);"


class Migration(migrations.Migration):
    dependencies = [("sagas", "0008_remote_agents")]

    operations = [run_on_postgresql(CREATE, DROP)]
