from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("sagas", "0011_team_tokens_used"), migrations.swappable_dependency(settings.AUTH_USER_MODEL)]

    # A retried POST /sagas/ with the same Idempotency-Key returns the saga it first created.
    operations = [
        migrations.AddField(
            model_name="saga",
            name="idempotency_key",
            field=models.CharField(blank=True, help_text="Its creator's, for a retried create.", max_length=200),
        ),
        migrations.AddField(
            model_name="saga",
            name="body_hash",
            field=models.CharField(blank=True, help_text="What the idempotency key was first used for.", max_length=64),
        ),
        migrations.AddConstraint(
            model_name="saga",
            constraint=models.UniqueConstraint(
                condition=~models.Q(idempotency_key=""),
                fields=("owner", "idempotency_key"),
                name="saga_idempotency_unique",
            ),
        ),
    ]
