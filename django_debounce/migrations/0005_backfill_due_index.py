from django.db import migrations
from django.utils import timezone


def backfill(apps, schema_editor):
    """Give every pending or running key of the database store an entry in the due index
    (created empty by 0004). Without one, no pump would ever take a flight that was open when
    the app was upgraded. The entry is the migration's time: an entry may be earlier than the
    key needs (never later), and the pump's first take moves it to the time the key needs."""
    db = schema_editor.connection.alias
    key = apps.get_model("django_debounce", "DebounceKey")
    due = apps.get_model("django_debounce", "DebounceDue")
    now = timezone.now()
    rows = (
        key.objects.using(db)
        .filter(store="database")
        .exclude(state="idle")
        .values_list("key_hash", "task_name")
        .iterator(chunk_size=1000)
    )
    batch = []
    for key_hash, task_name in rows:
        batch.append(due(key_hash=key_hash, task_name=task_name, due_at=now))
        if len(batch) == 1000:
            due.objects.using(db).bulk_create(batch, ignore_conflicts=True)
            batch = []
    if batch:
        due.objects.using(db).bulk_create(batch, ignore_conflicts=True)


class Migration(migrations.Migration):
    dependencies = [
        ("django_debounce", "0004_dispatch_index"),
    ]

    operations = [
        migrations.RunPython(backfill, migrations.RunPython.noop, elidable=True),
    ]
