"""A trigger made after a lost last attempt runs (issue 12.1): a flight whose only attempt
was lost (killed by its hard time limit, or its pool process SIGKILLed) is given up once its
lease runs out, and gives up only the triggers that attempt covered; a trigger made after the
lease ran out gets a run of its own. Real worker processes, both stores."""

from __future__ import annotations

import os
import signal

import pytest

from django_debounce import dbtime
from django_debounce.models import DebounceRun
from tests.support.helpers import wait_for
from tests.testapp.models import RunLog
from tests.testapp.tasks import hard_limited

pytestmark = pytest.mark.worker


def bodies(tag: str) -> list[RunLog]:
    return list(RunLog.objects.filter(task="testapp.hard_limited", tag=tag).order_by("started"))


def lease_ran_out(tag: str) -> bool:
    status = hard_limited.status(tag)
    assert status is not None
    # no lease any more (a pump found the run lost), or a lease in the past
    return status.lease_until is None or status.lease_until < dbtime.now()


@pytest.mark.parametrize("how", ["hard time limit", "SIGKILL"])
def test_a_trigger_after_a_lost_last_attempt_runs(worker, unique_tag, how):
    hard_limited.trigger(unique_tag, 10)
    first = wait_for(lambda: bodies(unique_tag), timeout=30, message="the first body")[0]
    if how == "SIGKILL":
        os.kill(first.pid, signal.SIGKILL)  # the pool process dies mid-body
    # The lease (time limit 2 s + 5 s) runs out with no finish; trigger right after it did,
    # before or after the pump has found the lost run (both must run the new trigger).
    wait_for(lambda: lease_ran_out(unique_tag), timeout=30, message="the lease to run out")
    hard_limited.trigger(unique_tag, 0)
    runs = wait_for(
        lambda: [b for b in bodies(unique_tag) if b.finished is not None],
        timeout=40,
        message="the body of the later trigger",
    )
    (second,) = runs
    assert second.payload == {"sleep": 0} and second.triggers == 1
    assert second.started > first.started + 7  # after the first run's lease ran out
    assert len(bodies(unique_tag)) == 2  # the killed body was not retried (max_retries=0)
    status = wait_for(
        lambda: (s := hard_limited.status(unique_tag)) and s.last_outcome == "success" and s,
        timeout=20,
        message="the later run's success",
    )
    assert status.pending == 0 and not status.running
    # the durable history: the lost attempt, its give-up, then the later trigger's success
    rows = DebounceRun.objects.filter(debounce_key__key=f"hard_limited:{unique_tag}")
    wait_for(lambda: rows.filter(outcome="success").exists(), timeout=20, message="the run history")
    history = list(rows.order_by("run_id").values_list("outcome", "triggers"))
    assert history[-1] == ("success", 1), history
    # the lost attempt, then the give-up of the one trigger it covered (not the later one)
    assert history[:-1] == [("lost", 1), ("failure", 1)], history
