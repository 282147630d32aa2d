"""``DEBOUNCE_PUMP_QUEUE_CAP``: a pump never fills a queue past its cap (docs/settings.md).

A debounced task registered in this process only (the suite's worker never takes its entries)
routes its messages to a queue no worker consumes, where the test counts them (``LLEN`` of
the Celery Redis queue) after every tick of a pump the test drives itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis

from django_debounce.pump import Pump, stats
from tests.celery_app import app
from tests.support.helpers import wait_for
from tests.support.private_tasks import private_task

NAME = "tests.capped_pumped"
QUEUE = "debounce-capped-pumped"
FLIGHTS = 300


@pytest.fixture
def capped_task(broker: redis.Redis, settings: Any) -> Iterator[Any]:
    """A debounced task (wait 1 s) whose flights wait in the due index (the pump interval is
    shorter than the wait) and whose messages go to a queue of its own."""
    settings.DEBOUNCE_PUMP_INTERVAL = 0.05
    broker.delete(QUEUE)
    try:
        with private_task(NAME, wait=1.0, queue=QUEUE) as task:
            yield task
    finally:
        broker.delete(QUEUE)


@pytest.mark.parametrize(("cap", "batch"), [(50, 20), (15, 40)], ids=["cap>batch", "cap<batch"])
@pytest.mark.django_db(transaction=True)
def test_a_pump_never_fills_a_queue_past_its_cap(store, capped_task, broker, settings, cap, batch):
    settings.DEBOUNCE_PUMP_QUEUE_CAP = cap
    settings.DEBOUNCE_PUMP_BATCH = batch
    for n in range(FLIGHTS):
        assert not capped_task.trigger(f"k{n}").scheduled  # waits in the index
    backend = capped_task.get_backend()
    wait_for(
        lambda: backend.index_stats([NAME])[NAME].due == FLIGHTS,
        timeout=30,
        message=f"the {FLIGHTS} flights to be due",
    )
    assert broker.llen(QUEUE) == 0

    pump = Pump(app=app, tasks={NAME: capped_task})
    depths: list[int] = []

    def tick() -> int:
        pump.tick()
        depths.append(broker.llen(QUEUE))
        # Several pumps may pass the cap by one batch each; one pump alone never passes it.
        assert depths[-1] <= cap, f"queue depth after each tick (cap {cap}): {depths}"
        return depths[-1]

    # The pump fills the queue up to its cap, and no further however often it ticks; the
    # rest of the flights wait in the index.
    wait_for(lambda: tick() == cap, timeout=30, message="the pump to fill the queue to its cap")
    for _ in range(5):
        tick()
    assert QUEUE in stats.capped
    assert backend.index_stats([NAME])[NAME].due == FLIGHTS - cap

    # A worker takes 10 messages: the pump tops the queue up again, to the cap and no more.
    broker.ltrim(QUEUE, 10, -1)
    wait_for(lambda: tick() == cap, timeout=30, message="the pump to top the queue up")
    for _ in range(5):
        tick()
    assert backend.index_stats([NAME])[NAME].due == FLIGHTS - cap - 10
    assert capped_task.ran == []  # published, never claimed here
