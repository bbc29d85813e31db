from django.db import migrations

from config.postgresql.migrations import run_on_postgresql

# On PostgreSQL the database itself refuses to change or remove a journal event, whoever asks.
CREATE = """
CREATE OR REPLACE FUNCTION journal_event_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'journal events are append-only (% refused)', TG_OP USING ERRCODE = 'restrict_violation';
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER journal_event_append_only
    BEFORE UPDATE OR DELETE ON journal_journalevent
    FOR EACH ROW EXECUTE FUNCTION journal_event_append_only();
"""
DROP = """
DROP TRIGGER IF EXISTS journal_event_append_only ON journal_journalevent;
DROP FUNCTION IF EXISTS journal_event_append_only();
"""


class Migration(migrations.Migration):
    dependencies = [("journal", "0001_initial")]

    operations = [run_on_postgresql(CREATE, DROP)]
