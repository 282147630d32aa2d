"""``python -m tests.support.sqlite_fork DIR FORKS``: forks a process ``FORKS`` times while a
thread of it writes to an SQLite database in ``thread_tick()`` ticks, as the prefork pool forks
its children while the pump and the lease keeper tick. Each child writes three
rows on a connection of its own; the parent checks that every child's rows are there.

Prints one JSON line: ``{"forks", "children_failed", "rows_missing", "ticks", "tick_errors",
"integrity"}``. Run in a process of its own: Django is configured here, for SQLite alone.

The thread pauses ``PAUSE`` between ticks, as the worker's threads do (for much longer). Ticks
back to back starved the children: SQLite's busy handler polls (sleeping up to 100 ms between
tries) and queues nobody, so a thread that takes the write lock again microseconds after
releasing it can keep a child's write out until the child's busy ``timeout`` (5 s) ends with
"database is locked". On a loaded machine that happened (measured: 1 child of 60 failed, its
3 rows missing, at load 8); it said nothing about the forks. With the pause, a fork still
finds a tick in progress often enough that, without the guard, children still fail with
"database is locked" (measured: 3 of 60, ``_uses_sqlite`` patched to ``False``).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import warnings
from pathlib import Path

import django
from django.conf import settings

PAUSE = 0.001  # seconds between two ticks of the thread


def main(directory: Path, forks: int) -> dict[str, object]:
    settings.configure(
        DATABASES={
            "default": {
                "ENGINE": "django.db.backends.sqlite3",
                "NAME": str(directory / "fork.sqlite3"),
                # The suite's (and the docs') settings for several writer processes.
                "OPTIONS": {
                    "transaction_mode": "IMMEDIATE",
                    "init_command": "PRAGMA journal_mode=WAL;",
                    "timeout": 5,
                },
            }
        },
        INSTALLED_APPS=[],
        USE_TZ=True,
    )
    django.setup()
    from django.db import connection, connections, transaction

    from django_debounce.dbconn import thread_tick

    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, who TEXT)")
    stop = threading.Event()
    ticks: list[int] = [0]
    tick_errors: list[str] = []
    started = threading.Event()

    def ticking() -> None:  # a worker thread: a write transaction per tick, a pause between
        while not stop.is_set():
            try:
                with thread_tick(), transaction.atomic(), connection.cursor() as cursor:
                    cursor.execute("INSERT INTO t (who) VALUES ('thread')")
                    cursor.execute("SELECT count(*) FROM t")
                    cursor.fetchone()
                ticks[0] += 1
            except Exception as exc:  # reported in the result
                tick_errors.append(repr(exc))
            started.set()
            stop.wait(PAUSE)  # the thread's interval (the pump's is a second)
        connections.close_all()

    thread = threading.Thread(target=ticking)
    thread.start()
    started.wait(10)
    failed = missing = 0
    warnings.simplefilter("ignore", DeprecationWarning)  # fork() with threads: the point here
    for n in range(forks):
        pid = os.fork()
        if pid == 0:  # the child: as Celery's fixup does, drop the inherited connections
            code = 0
            try:
                connections.close_all()
                for _ in range(3):
                    with connection.cursor() as cursor:
                        cursor.execute("INSERT INTO t (who) VALUES (%s)", [f"child {n}"])
                connections.close_all()
            except BaseException:
                code = 1
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        failed += status != 0
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM t WHERE who = %s", [f"child {n}"])
            missing += 3 - cursor.fetchone()[0]
    stop.set()
    thread.join(30)
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA integrity_check")
        integrity = cursor.fetchone()[0]
    return {
        "forks": forks,
        "children_failed": failed,
        "rows_missing": missing,
        "ticks": ticks[0],
        "tick_errors": tick_errors[:3],
        "integrity": integrity,
    }


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]), int(sys.argv[2]))))
