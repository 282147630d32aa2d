import uuid

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("testapp", "0002_batchy")]

    operations = [
        migrations.CreateModel(
            name="Ticket",
            fields=[
                (
                    "id",
                    models.UUIDField(
                        default=uuid.uuid4, editable=False, primary_key=True, serialize=False
                    ),
                ),
                ("title", models.CharField(default="", max_length=50)),
            ],
        ),
    ]
