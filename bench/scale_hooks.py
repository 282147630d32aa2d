"""What the scale benchmark's processes share (``bench/scale.py``): the run notes of the bodies,
which process and thread opens each PostgreSQL session, and the signal that a worker consumes.
Imported by ``bench.scale_tasks`` and ``bench.idle_tasks``.

Every body that the benchmark times notes its start in a file of its own process
(``BENCH_RUNS_DIR/<pid>``, one line ``tag key time``, appended with one ``os.write``): no round
trip to any server, so the note costs the bare task and the debounced one the same few
microseconds, and the runner reads the files to get run counts and start times.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import redis
from celery.signals import worker_init, worker_process_init, worker_ready
from django.db.backends.signals import connection_created
from django.dispatch import receiver

_fd: tuple[int, int] | None = None


def note(tag: str, key: Any = "-") -> None:
    """Append ``tag key start-time`` to this process's run file."""
    global _fd
    now = time.time()
    pid = os.getpid()
    if _fd is None or _fd[0] != pid:
        directory = os.environ.get("BENCH_RUNS_DIR")
        if not directory:
            return
        fd = os.open(
            os.path.join(directory, str(pid)), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644
        )
        _fd = (pid, fd)
    os.write(_fd[1], f"{tag} {key} {now:.6f}\n".encode())


# Which process this is: the runner ("client"), a worker's main process ("worker") or one of
# its pool processes ("pool"); every new database connection is noted with it and the thread.
_role = "client"


@worker_init.connect
def _in_worker(**kwargs: Any) -> None:
    global _role
    _role = "worker"


@worker_process_init.connect
def _in_pool(**kwargs: Any) -> None:
    global _role
    _role = "pool"


@receiver(connection_created)
def _session(sender: Any, connection: Any, **kwargs: Any) -> None:
    """A new PostgreSQL session: noted as ``pg_session <role>:<thread name>``."""
    thread = threading.current_thread().name.replace(" ", "-")
    note("pg_session", f"{_role}:{thread}")


@worker_ready.connect
def _ready(sender: Any = None, **kwargs: Any) -> None:
    """Tell the runner this worker consumes, and which OS thread of its main process is which
    (the consumer loop, the pump, the lease keeper), for CPU time per thread."""
    url = os.environ.get("BENCH_STATS_URL")
    if url:
        client = redis.Redis.from_url(url)
        threads = {str(t.native_id): t.name for t in threading.enumerate() if t.native_id}
        client.hset(f"threads:{sender.hostname}", mapping=threads)
        client.set(f"ready:{sender.hostname}", os.getpid())
