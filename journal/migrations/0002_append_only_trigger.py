from django.db import migrations

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


def on_postgresql(sql: str):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            # No params: with params psycopg would read the '%' in RAISE's format as a placeholder.
            schema_editor.execute(sql, params=None)

    return run


class Migration(migrations.Migration):
    dependencies = [("journal", "0001_initial")]

    operations = [migrations.RunPython(on_postgresql(CREATE), on_postgresql(DROP))]
