from django_debounce.models import DebounceKey, DebounceRun
from tests.support.helpers import wait_for
from tests.testapp.models import RunLog
from tests.testapp.tasks import record


def test_burst_runs_once(worker, unique_tag):
    for _ in range(5):
        record.trigger(unique_tag)
    logs = wait_for(lambda: list(RunLog.objects.filter(tag=unique_tag, finished__isnull=False)))
    assert len(logs) == 1
    assert logs[0].triggers == 5
    key = DebounceKey.objects.get(task_name="testapp.record")
    wait_for(lambda: DebounceKey.objects.get(pk=key.pk).state == "idle")
    key.refresh_from_db()
    assert (key.pending, key.runs, key.merged, key.triggers) == (0, 1, 4, 5)
    assert DebounceRun.objects.get().outcome == "success"
