from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("sagas", "0010_open_requests_by_collaborator")]

    # A team's tokens so far, which its teammates' turns add to as they store them (the runtime's
    # migration agents/0008 counts what existing transcripts hold).
    operations = [
        migrations.AddField(
            model_name="team",
            name="tokens_used",
            field=models.PositiveBigIntegerField(
                default=0, help_text="Tokens its teammates' model calls used, counted by the turns that stored them."
            ),
        ),
    ]
