from django.db import migrations

from config.postgresql.migrations import run_on_postgresql

# On PostgreSQL TRUNCATE fires no row trigger, so the journal refuses it with a statement trigger
# of its own. One documented exemption: a session that sets `agora.allow_journal_truncate` to
# `on`. Only the test suite does, for the test database alone (tests/conftest.py), since Django
# empties a test database between tests with TRUNCATE.
CREATE = """
CREATE OR REPLACE FUNCTION journal_event_refuse_truncate() RETURNS trigger AS $$
BEGIN
    IF coalesce(current_setting('agora.allow_journal_truncate', true), '') = 'on' THEN
        RETURN NULL;
    END IF;
    RAISE EXCEPTION 'journal events are append-only (TRUNCATE refused)' USING ERRCODE = 'restrict_violation';
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER journal_event_refuse_truncate
    BEFORE TRUNCATE ON journal_journalevent
    FOR EACH STATEMENT EXECUTE FUNCTION journal_event_refuse_truncate();
"""
DROP = """
DROP TRIGGER IF EXISTS journal_event_refuse_truncate ON journal_journalevent;
DROP FUNCTION IF EXISTS journal_event_refuse_truncate();
"""


class Migration(migrations.Migration):
    dependencies = [("journal", "0003_protect_history")]

    operations = [run_on_postgresql(CREATE, DROP)]
