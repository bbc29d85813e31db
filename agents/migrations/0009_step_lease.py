from django.db import migrations, models


class Migration(migrations.Migration):
    """The routing lease becomes the step's: a later step holds it while its hooks run."""

    dependencies = [("agents", "0008_team_tokens_counted")]

    operations = [
        migrations.RenameField(model_name="prompt", old_name="routing_until", new_name="step_until"),
        migrations.AlterField(
            model_name="prompt",
            name="step_until",
            field=models.DateTimeField(
                blank=True,
                help_text="Who runs the step's slow part (the router, hooks) holds this lease: a doorbell meanwhile "
                "does not run it again.",
                null=True,
            ),
        ),
    ]
