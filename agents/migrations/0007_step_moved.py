from django.db import migrations

from config.postgresql.migrations import guard_function


class Migration(migrations.Migration):
    dependencies = [("agents", "0006_prompt_expanded")]

    # An orchestration step moves its prompt on with a compare-and-set on its step. On PostgreSQL
    # nothing waits for its answer: the server fails the step's transaction with this SQLSTATE when
    # it changed no row (another task moved the prompt first), and the step writes nothing
    # (agents.orchestrator.steps.move).
    operations = [guard_function("agora_step_moved", "moved", "AG002", "the prompt was moved on by another task")]
