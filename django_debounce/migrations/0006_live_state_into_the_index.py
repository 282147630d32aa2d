"""Release 0.1 -> 0.2: every live key enters the new due index, so the pump finds it.

- Keys the database store holds (pending or running) get their ``DebounceDue`` entry, at the
  migration's time: an entry may be earlier than the key needs (never later), and the pump's
  first take moves it to the time the key needs.
- Keys held in Redis (pending or running) get a recheck of their durable record now: the
  pump compares it with Redis, adopts a flight the previous release keeps in its own layout,
  and rebuilds one whose Redis state is gone.

Only live rows are read (through the state index), in batches: idle keys, usually the most,
are not touched.
"""

from django.db import migrations
from django.utils import timezone

BATCH = 1000


def forwards(apps, schema_editor):
    DebounceKey = apps.get_model("django_debounce", "DebounceKey")
    DebounceDue = apps.get_model("django_debounce", "DebounceDue")
    db = schema_editor.connection.alias
    now = timezone.now()
    live = DebounceKey.objects.using(db).exclude(state="idle")
    redis = live.filter(store="redis", recheck_at__isnull=True)
    while True:
        pks = list(redis.values_list("pk", flat=True)[:BATCH])
        if not pks:
            break
        DebounceKey.objects.using(db).filter(pk__in=pks).update(recheck_at=now)
    rows = live.filter(store="database").values_list("key_hash", "task_name")
    batch = []
    for h, t in rows.iterator(chunk_size=BATCH):
        batch.append(DebounceDue(key_hash=h, task_name=t, due_at=now))
        if len(batch) == BATCH:
            DebounceDue.objects.using(db).bulk_create(batch, ignore_conflicts=True)
            batch = []
    if batch:
        DebounceDue.objects.using(db).bulk_create(batch, ignore_conflicts=True)


class Migration(migrations.Migration):
    dependencies = [("django_debounce", "0005_dispatch_index")]

    operations = [migrations.RunPython(forwards, migrations.RunPython.noop, elidable=True)]
