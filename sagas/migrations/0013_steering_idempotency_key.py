from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("sagas", "0012_saga_idempotency_key")]

    # A retried steer with the same Idempotency-Key returns the message it first queued. The columns
    # have database defaults: the runtime's plain INSERT of every other steering item leaves them out.
    operations = [
        migrations.AddField(
            model_name="steeringitem",
            name="body_hash",
            field=models.CharField(blank=True, default="", db_default="", max_length=64),
        ),
        migrations.AddField(
            model_name="steeringitem",
            name="idempotency_key",
            field=models.CharField(blank=True, default="", db_default="", max_length=200),
        ),
        migrations.AddConstraint(
            model_name="steeringitem",
            constraint=models.UniqueConstraint(
                condition=~models.Q(idempotency_key=""),
                fields=("recipient", "sender", "idempotency_key"),
                name="steering_idempotency_unique",
            ),
        ),
    ]
