"""End-to-end smoke test of the Redis store with a real worker, run in every leg of
``scripts/test``: on the plain Redis, and in the Redis Cluster run
(``DEBOUNCE_TEST_STORE_CLUSTER=1``: the store on a 3-master cluster from
``scripts/services.py``; the broker stays plain Redis).
Triggers merge, flights wait in the due index spread over the cluster's nodes, the pumps take
them, the worker runs them, the recorder drains the per-shard records of every node, and a
flight whose hash was lost is rebuilt by the recheck."""

from __future__ import annotations

import os
from datetime import timedelta

import pytest
from django.test import override_settings
from django.utils import timezone

from django_debounce import trigger_many
from django_debounce.backends import get_backend
from django_debounce.backends.redis import SHARDS
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
    backend = get_backend()
    assert backend.cluster is CLUSTER  # the cluster run really runs on the cluster
    if CLUSTER:
        masters = {n.name for n in backend.client.get_primaries()}
        assert len(masters) == 3
        shard_nodes = {
            backend.client.get_node_from_key(backend.shard_prefix(s)).name for s in range(SHARDS)
        }
        assert shard_nodes == masters  # the 16 shards spread over every master

    # flights due at once (direct publish) and merged triggers
    tags = [f"{unique_tag}-{i}" for i in range(24)]
    for _ in range(3):
        for tag in tags:
            record.trigger(tag)
    # a flight that waits in the due index (1.6 s): the pump publishes it
    lodash_debounce.trigger(unique_tag)
    # pending flights in the index, on every node, in one batch
    slow = [f"{unique_tag}-slow-{i}" for i in range(48)]
    assert all(r.pending == 1 for r in trigger_many(record_slow, slow))
    assert backend.index_stats([record_slow.name])[record_slow.name].depth == 48

    for tag in tags:
        run = wait_for(
            lambda tag=tag: RunLog.objects.filter(tag=tag, finished__isnull=False).first(),
            timeout=30,
            message=f"the run of {tag}",
        )
        assert run.triggers == 3
    wait_for(
        lambda: RunLog.objects.filter(tag=unique_tag, task=lodash_debounce.name).exists(),
        timeout=15,
        message="the run the pump published from the index",
    )
    assert stays(lambda: RunLog.objects.filter(task=record.name).count() == len(tags), duration=1)
    # the recorder drained every node's records into the durable record
    wait_for(
        lambda: (
            DebounceRun.objects.filter(task_name=record.name, outcome="success").count()
            == len(tags)
            and DebounceKey.objects.filter(task_name=record.name, state="idle").count() == len(tags)
        ),
        timeout=20,
        message="the records of the runs",
    )

    # a pending flight whose hash was lost is rebuilt from its durable record
    h = key_hash(record_slow.name, record_slow.resolve((slow[0],), {})[0])
    backend.client.delete(backend.state_key(h))
    assert backend.live_state(h) is None
    assert backend.recheck(now=timezone.now() + timedelta(seconds=120)) == 1
    assert backend.live_state(h)["pending"] == 1
    for tag in slow:
        assert record_slow.cancel(tag) == 1
