"""End-to-end smoke test of the Redis store with a real worker, run in every leg of
``scripts/test``: on the plain Redis, and in the Redis Cluster run
(``DEBOUNCE_TEST_STORE_CLUSTER=1``: the store on a 3-master cluster from
``scripts/services.py``; the broker stays plain Redis).
Triggers merge in counters spread over the cluster's nodes, flights wait in the database's due
index, the pumps take them, the worker's claims fold the counters into the rows and run them,
and a flight whose counter was lost still holds its row's triggers."""

from __future__ import annotations

import os

import pytest
from django.test import override_settings

from django_debounce import trigger_many
from django_debounce.backends import get_backend
from django_debounce.keys import key_hash
from django_debounce.models import DebounceKey, DebounceRun
from tests.support.helpers import stays, wait_for
from tests.testapp.models import RunLog
from tests.testapp.tasks import lodash_debounce, record, record_slow

pytestmark = pytest.mark.worker

CLUSTER = os.environ.get("DEBOUNCE_TEST_STORE_CLUSTER") == "1"


@override_settings(DEBOUNCE_BACKEND="redis", DEBOUNCE_DISPATCH_GRACE=1)
def test_a_worker_runs_the_redis_store_end_to_end(
    celery_worker_session, transactional_db, unique_tag
):
    from redis.cluster import RedisCluster

    backend = get_backend()
    # the cluster run really runs on the cluster
    assert isinstance(backend.client, RedisCluster) is CLUSTER
    tags = [f"{unique_tag}-{i}" for i in range(24)]
    if CLUSTER:
        masters = {n.name for n in backend.client.get_primaries()}
        assert len(masters) == 3
        nodes = {
            backend.client.get_node_from_key(
                backend.counter_key(key_hash(record.name, record.resolve((tag,), {})[0]))
            ).name
            for tag in tags
        }
        assert nodes == masters  # the keys' counters spread over every master

    # flights due at once (direct publish) and merged triggers: each key's three back to back
    # (record's wait is 0.3 s; a round over every key took longer on a loaded machine)
    for tag in tags:
        for _ in range(3):
            record.trigger(tag)
    # a flight that waits in the due index (1.6 s): the pump publishes it
    lodash_debounce.trigger(unique_tag)
    # pending flights in the index, on every node, in one batch
    slow = [f"{unique_tag}-slow-{i}" for i in range(48)]
    assert all(r.pending == 1 for r in trigger_many(record_slow, slow))
    assert backend.index_stats([record_slow.name])[record_slow.name].depth == 48

    def covered(tag: str) -> int:
        return sum(r.triggers for r in RunLog.objects.filter(tag=tag, finished__isnull=False))

    for tag in tags:  # every trigger covered by a run, once
        wait_for(lambda tag=tag: covered(tag) >= 3, timeout=30, message=f"the runs of {tag}")
    wait_for(
        lambda: RunLog.objects.filter(tag=unique_tag, task=lodash_debounce.name).exists(),
        timeout=15,
        message="the run the pump published from the index",
    )
    runs = RunLog.objects.filter(task=record.name).count()
    assert stays(lambda: RunLog.objects.filter(task=record.name).count() == runs, duration=1)
    assert all(covered(tag) == 3 for tag in tags)
    assert runs < 3 * len(tags)  # the counters merged triggers
    # every run's row, and every key's, in the database
    wait_for(
        lambda: (
            DebounceRun.objects.filter(task_name=record.name, outcome="success").count() == runs
            and DebounceKey.objects.filter(task_name=record.name, state="idle").count() == len(tags)
        ),
        timeout=20,
        message="the records of the runs",
    )

    # merged triggers of the pending flights, counted on every node; a counter lost (as a
    # cache may forget it) costs its count, never the flight its row holds
    # (a flight's second trigger makes its counter on the row path, the third merges into it)
    assert all(r.pending == 2 for r in trigger_many(record_slow, slow))
    hashes = [key_hash(record_slow.name, record_slow.resolve((tag,), {})[0]) for tag in slow]
    assert backend.counted(hashes) == {}  # made, empty
    trigger_many(record_slow, slow)
    assert backend.counted(hashes) == dict.fromkeys(hashes, 1)
    backend.client.delete(backend.counter_key(hashes[0]))
    assert backend.live_state(hashes[0])["pending"] == 2
    assert record_slow.cancel(slow[0]) == 2
    for tag in slow[1:]:
        assert record_slow.cancel(tag) == 3
