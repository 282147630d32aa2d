"""The database store: a key's state is its ``DebounceKey`` row, changed under a row lock, and
the due index is the ``DebounceDue`` table (one row per key that needs attention).

Every operation is the rule of ``django_debounce/machine.py`` (``KeyModel``, the reference model)
applied in Python to the row read in integer microseconds (``_Key``, whose methods carry the
model's names and rule order, as the Lua scripts of the Redis store do), then written back in one
statement: the changed columns of the key row, its index entry (``_reindex``), and the run
records (``database_sql.py`` builds them).

Statements per step, on PostgreSQL:

- a trigger that only joins an open flight (``KeyModel.is_plain_merge``): one
  ``UPDATE ... RETURNING`` in autocommit (the index entry stays: it may be early, never late).
  For a key this process has not seen lately (``_saw``), the same statement also makes the
  row of a key that has none, its flight opened, and its index entry (``INSERT ... SELECT
  ... WHERE NOT EXISTS`` the merge, ``ON CONFLICT DO NOTHING``): a new key is one statement
  too. Its row is ``_Key.trigger`` applied to the default row, worked out once per options
  at two clocks (``_opening``): it moves with the clock, which the statement adds;
- any other step of one key: one transaction of two statements: ``SELECT ... FOR UPDATE``
  (with the clock; for a trigger, ``INSERT ... ON CONFLICT DO NOTHING RETURNING`` with the
  locked existing row, so a row is made if there is none), then one statement whose
  ``WITH`` parts update the key row, put or delete its index entry and write its run
  records (a claim's ``DebounceRun``, a finish's outcome, a lost run's "lease ran out");
- the pump's take: one transaction of three statements per batch: the clock, the due entries
  and their keys locked ``FOR UPDATE ... SKIP LOCKED`` (concurrent pumps never take one entry
  twice and never wait for each other), then one statement that writes the whole batch (rows
  grouped by changed columns, ``unnest`` arrays) and reads the earliest entry left;
- the lease keeper's extend: one statement for the whole batch.

With psycopg 3 (``DEBOUNCE_DATABASE_PREPARE``, on by default) the statements are server-side
prepared (planned once per connection), and a transaction outside any atomic block of the
caller is sent in pipeline mode: ``BEGIN`` with its first statement, ``COMMIT`` with its
writes, so a two-statement step is two round trips (``_step``).

SQLite has no row locks: a step's transaction holds the database's write lock. With
``transaction_mode`` ``IMMEDIATE`` Django's ``BEGIN IMMEDIATE`` takes it; otherwise the first
statement of the step is a write (the trigger's ``INSERT ... ON CONFLICT DO NOTHING``, else a
write that changes nothing), which takes the lock at once and waits for it with the busy
timeout (a deferred transaction that reads first cannot upgrade its lock later). Its clock is
this host's (the database is a local file); PostgreSQL's is ``clock_timestamp()``.

A row whose ``store`` is ``"redis"`` mirrors a key the Redis store holds: a trigger here takes
the key over with a flight of its own (``_Key.adopt``; the flight in Redis stays Redis's), an
in-process claim (``fire`` with ``seq=None``) runs the flight its record holds; every other
step leaves it alone.
"""

from __future__ import annotations

import copy
import json
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from functools import cache, partial, wraps
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connections, router, transaction

from django_debounce import conf
from django_debounce.backends.base import BaseBackend, LiveRun, Taken
from django_debounce.backends.database_sql import (
    BOOL,
    FIELDS,
    HEAD,
    JSON,
    KEY,
    KINDS,
    STR,
    TIME,
    Opening,
    Sql,
    Writes,
    adapt_time,
    q,
    to_dt,
    to_us,
)
from django_debounce.dbtime import from_db
from django_debounce.dispatch import LABEL
from django_debounce.keys import dumps
from django_debounce.models import DebounceDue, DebounceKey
from django_debounce.state import (
    Claim,
    Dispatch,
    FireAction,
    FireDecision,
    FlightOptions,
    IndexStats,
    TriggerResult,
)

logger = logging.getLogger("django_debounce")

US = 1_000_000
_OVERLAP = [a for a, _c, _k in FIELDS].index("overlap")
Msg = tuple[int, int]  # a message to publish: (seq, countdown in us)
# DebounceRun.Outcome and DebounceKey.State values
RUNNING, SUCCESS, FAILURE, LOST, RETRY = "running", "success", "failure", "lost", "retry"
IDLE, PENDING = "idle", "pending"


@dataclass(frozen=True)
class _Cfg:
    """A task's options in microseconds (``django_debounce.machine.Config``)."""

    wait: int
    max_wait: int | None
    leading: bool
    trailing: bool
    overlap: bool
    collect_limit: int | None
    lease: int
    collect_bytes: int | None = None

    @property
    def collect(self) -> bool:
        return self.collect_limit is not None

    def batch(self, items: list[Any]) -> int:
        """How many of ``items`` one run takes: at most ``collect_limit``, and at most
        ``collect_bytes`` bytes of their JSON (never fewer than one)."""
        assert self.collect_limit is not None
        took, used = 0, 0
        for item in items[: self.collect_limit]:
            size = len(dumps(item).encode())
            if self.collect_bytes and took and used + size > self.collect_bytes:
                break
            took, used = took + 1, used + size
        return took


_configs: dict[FlightOptions, _Cfg] = {}


def _cfg(options: FlightOptions) -> _Cfg:
    cfg = _configs.get(options)
    if cfg is None:
        cfg = _configs[options] = _Cfg(
            wait=int(round(options.wait * US)),
            max_wait=None if options.max_wait is None else int(round(options.max_wait * US)),
            leading=options.leading,
            trailing=options.trailing,
            overlap=options.overlap,
            collect_limit=options.collect_limit,
            lease=int(round(options.lease * US)),
            collect_bytes=options.collect_bytes,
        )
    return cfg


@cache
def _prepared_cursor() -> type | None:
    """A psycopg 3 cursor class whose every statement is a server-side prepared statement
    (bound on the server, parsed and planned once per connection), or ``None`` without
    psycopg 3 or without pipeline mode (libpq 14)."""
    try:
        import psycopg
    except ImportError:  # psycopg2 or no PostgreSQL driver
        return None
    if not psycopg.Pipeline.is_supported():
        return None

    class PreparedCursor(psycopg.Cursor):  # type: ignore[type-arg]
        def execute(  # type: ignore[override]
            self, query: Any, params: Any = None, *, prepare: bool | None = None, **kw: Any
        ) -> Any:
            conn = self.connection
            prepare = prepare is not False
            if conn.prepare_threshold is not None or not prepare:
                return super().execute(query, params, prepare=prepare, **kw)
            # Django's default (None) turns psycopg's preparing off altogether, for poolers;
            # this cursor's statements are prepared anyway (DEBOUNCE_DATABASE_PREPARE)
            conn.prepare_threshold = _NEVER
            try:
                return super().execute(query, params, prepare=True, **kw)
            finally:
                conn.prepare_threshold = None

    return PreparedCursor


_NEVER = 1 << 30  # psycopg's prepare_threshold: prepare nothing by count
# SQLSTATEs of a prepared statement the server does not have, or has already (a pooler that
# moves a client between server sessions)
_PREPARED_LOST = ("26000", "42P05")


def _retrying(method: Any) -> Any:
    """A step of ``DatabaseBackend`` (one transaction, or one statement in autocommit), run
    again unprepared when the server lost a prepared statement (``DatabaseBackend._again``)."""

    @wraps(method)
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        return self._again(partial(method, self, *args, **kwargs))

    return run


def _lost_prepared(exc: BaseException) -> bool:
    """Whether ``exc`` (Django's, or the driver's error it wraps) says the server lost, or
    already had, a prepared statement of this client."""
    seen: BaseException | None = exc
    while seen is not None:
        if getattr(seen, "sqlstate", None) in _PREPARED_LOST:
            return True
        seen = seen.__cause__
    return False


_IDLE = 0  # psycopg.pq.TransactionStatus.IDLE: no transaction open


def _union(first: list[Any], then: list[Any]) -> list[Any]:
    """``first`` followed by the items of ``then`` not already in it (by JSON value)."""
    out = list(first)
    seen = {dumps(i) for i in out}
    for item in then:
        if dumps(item) not in seen:
            seen.add(dumps(item))
            out.append(item)
    return out


def _min(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


class _Key:
    """The state of one key, read from its row (times in integer microseconds). Twin of
    ``KeyModel`` in django_debounce/machine.py and of common.lua: the same rules in the same order.

    Payloads: JSON text when not collecting (never parsed but for a claim), the list of items
    when collecting."""

    pending: int
    flight_id: int
    first: int | None
    last: int | None
    anchor: int | None
    due: int | None
    payload: Any
    due_fixed: bool
    attempt: int
    not_before: int | None
    seq: int
    taken: bool
    taken_at: int | None
    run_id: int
    run_seq: int
    running_until: int | None
    run_triggers: int
    run_payload: Any
    run_first: int | None
    run_anchor: int | None
    bound: int | None
    run_bound: int | None
    attempted: int
    run_attempted: int
    run_attempt: int
    last_run_at: int | None
    triggers: int
    runs: int
    merged: int
    cancelled: int
    overlap: bool
    state: str
    store: str
    last_outcome: str
    beside: int | None
    updated: int | None

    def __init__(self, row: Sequence[Any], cfg: _Cfg | None, retake: int, direct: int) -> None:
        self.pk, self.key_hash, self.key, self.task_name = row[: len(HEAD)]
        if cfg is None:
            overlap = bool(row[len(HEAD) + _OVERLAP])
            cfg = _Cfg(0, None, False, True, overlap, None, 0)
        self.cfg = cfg
        self.retake = retake
        self.direct = direct
        self.events: list[int] = []  # run ids lost in this step
        self.covered: int | None = None  # triggers a give-up covered (finish)
        self.extra: dict[str, Any] = {}  # other columns to write (adopt)
        self.handed = False  # handed back to the Redis store (hand_back)
        orig = []
        for (attr, _col, kind), value in zip(FIELDS, row[len(HEAD) :], strict=True):
            if kind == TIME:
                value = to_us(value)
            elif kind == JSON:
                if cfg.collect:
                    value = json.loads(value) if isinstance(value, str) else value
                    if value is not None and not isinstance(value, list):
                        value = [value]  # the task collected since the flight opened
                    orig.append(dumps(value))
                    setattr(self, attr, value)
                    continue
                if value is not None and not isinstance(value, str):
                    value = dumps(value)
            elif kind == STR:
                value = value or ""
            elif kind == BOOL:
                value = bool(value)
            else:
                value = int(value)
            orig.append(value)
            setattr(self, attr, value)
        self._orig = orig
        # the last payload the row knows (hand_back): the open flight's, else the last claim's
        self.last_payload = self.payload if self.payload is not None else self.run_payload
        if self.pending and self.anchor is None:
            self.anchor = self.first  # rows written before the anchor existed
        self.overlap = cfg.overlap

    # -- writing -----------------------------------------------------------------------------

    def changes(self) -> tuple[tuple[str, ...], list[Any]]:
        """The columns that changed and their new values (times in microseconds, JSON as
        text); the row's ``state`` and ``store`` follow the state."""
        self.state = (
            RUNNING if self.running_until is not None else PENDING if self.pending else IDLE
        )
        self.store = "redis" if self.handed else "database"
        cols: list[str] = []
        values: list[Any] = []
        for (attr, col, kind), old in zip(FIELDS, self._orig, strict=True):
            value = getattr(self, attr)
            if kind == JSON and self.cfg.collect:
                value = dumps(value)
                if value == old:
                    continue
                if value == "null":
                    value = None
            elif value == old and type(value) is type(old):
                continue
            cols.append(col)
            values.append(value)
        for col, value in self.extra.items():
            cols.append(col)
            values.append(value)
        return tuple(cols), values

    # -- helpers (KeyModel's) ------------------------------------------------------------

    def next_seq(self, now: int) -> int:
        self.seq = max(self.seq + 1, now)
        return self.seq

    def live(self) -> bool:
        return self.running_until is not None

    def attention(self) -> int | None:
        """When the key next needs attention (its index entry), ``None`` for never."""
        times = []
        if self.running_until is not None:
            times.append(self.running_until)
        if self.pending and (self.running_until is None or self.cfg.overlap):
            if self.taken:
                assert self.taken_at is not None
                times.append(self.taken_at + self.retake)
            else:
                assert self.due is not None
                times.append(self.due)
        return min(times) if times else None

    def schedule(self, at: int, now: int) -> Msg | None:
        """The flight is due at ``at``: within ``direct`` of now its message goes out at once
        (taken, returned for the caller to publish); otherwise it waits in the index."""
        if at - now <= self.direct:
            seq = self.next_seq(now)
            self.taken = True
            self.taken_at = max(at, now)
            return seq, max(at - now, 0)
        self.taken = False
        self.taken_at = None
        return None

    def end_run(self) -> None:
        self.running_until = None
        self.run_seq = 0
        self.run_triggers = 0
        self.run_payload = None
        self.run_first = None
        self.run_anchor = None
        self.run_bound = None
        self.run_attempted = 0
        self.run_attempt = 0

    def rejoin(self, now: int, claimed: int, run_payload: Any) -> None:
        """``claimed`` triggers of the live run go back to pending with ``run_payload``: as the
        open flight, due at once, when nothing is pending; else into it (the newer payload
        wins; collected items of the run come first; the earlier first trigger, anchor and
        bound are kept). Twin of ``rejoin`` in common.lua and ``KeyModel._rejoin``."""
        if self.pending == 0:
            self.flight_id += 1
            self.first = self.run_first
            self.anchor = self.run_anchor if self.run_anchor is not None else self.run_first
            self.bound = self.run_bound
            self.last = self.last if self.last is not None else self.run_first
            self.payload = copy.deepcopy(run_payload)
            self.due = now
            self.due_fixed = False
            self.taken = False
            self.taken_at = None
            self.attempted = 0
        else:
            # newer triggers keep their quiet period (I3); the run's triggers are older
            self.first = _min(self.first, self.run_first)
            self.anchor = _min(self.anchor, self.run_anchor)
            self.bound = _min(self.bound, self.run_bound)
            if self.cfg.collect:
                self.payload = _union(run_payload or [], self.payload or [])
        self.pending += claimed

    def run_size(self) -> int:
        """The live run's claimed triggers (collect: items)."""
        return len(self.run_payload or []) if self.cfg.collect else self.run_triggers

    def unclaim(self, now: int) -> None:
        """The live run's triggers go back to pending (a lost run, or a failed one to retry);
        its claim is taken out of the totals, so I6 counts them once; all of them now count
        as attempted."""
        claimed = self.run_triggers
        size = self.run_size()
        self.runs = max(self.runs - 1, 0)
        self.merged = max(self.merged - max(claimed - 1, 0), 0)
        self.rejoin(now, claimed, self.run_payload)
        self.attempted += size
        if self.cfg.collect:
            self.attempted = min(self.attempted, len(self.payload or []))
        self.attempt = max(self.attempt, self.run_attempt)
        self.end_run()

    def give_up(self, now: int) -> None:
        """The live run is given up for the triggers an attempt covered; the others go back
        to pending (due at once, no attempt made). Twin of finish.lua's give-up and
        ``KeyModel._give_up``."""
        if self.cfg.collect:
            back_payload = (self.run_payload or [])[self.run_attempted :]
            back = len(back_payload)
        else:
            back_payload = self.run_payload
            back = self.run_triggers - self.run_attempted
        self.merged = max(self.merged - back, 0)
        self.covered = self.run_triggers - back
        attempted, pending_before = self.attempted, self.pending
        self.rejoin(now, back, back_payload)
        self.attempted = attempted if pending_before else 0
        if not pending_before:
            self.attempt = 0
        self.end_run()

    def recover_lease(self, now: int) -> bool:
        """A live run whose lease ran out is lost: its triggers go back to pending (I7)."""
        if self.running_until is None or self.running_until > now:
            return False
        lost = self.run_id
        attempt = self.run_attempt
        self.unclaim(now)
        self.attempt = max(self.attempt, attempt + 1)  # a lost run counts as an attempt
        self.last_outcome = LOST
        self.events.append(lost)
        return True

    def edge(self, now: int, wait: int, max_wait: int | None) -> str:
        """lodash's edges: ``leading`` when the last trigger is ``wait`` or more ago
        (timeSinceLastCall) or the last run ``max_wait`` or more ago (timeSinceLastInvoke)."""
        cfg = self.cfg
        if cfg.leading:
            if self.last is None or now - self.last >= wait:
                return "leading"
            if max_wait is not None and (
                self.last_run_at is None or now - self.last_run_at >= max_wait
            ):
                return "leading"
        return "trailing" if cfg.trailing else "drop"

    def anchor_at(self, now: int, wait: int, max_wait: int | None) -> int:
        """Where ``max_wait`` of a flight opened now counts from (lodash's lastInvokeTime):
        the last run's claim while the stream goes on, else now."""
        if (
            max_wait is not None
            and self.last is not None
            and now - self.last < wait
            and self.last_run_at is not None
            and now - self.last_run_at < max_wait
        ):
            return self.last_run_at
        return now

    def is_plain_merge(self, now: int) -> bool:
        if self.cfg.collect or self.pending == 0:
            return False
        return self.running_until is None or self.running_until > now

    def current(self, run_id: int) -> bool:
        return self.run_id == run_id and self.running_until is not None

    def adopt(self, now: int, beside: bool) -> None:
        """Take over a row whose live state is in Redis (a trigger during a Redis outage):
        the flight in Redis stays Redis's; this store opens its own. With ``beside`` (the
        ``auto`` store), a Redis flight the row recorded is remembered, so the row goes back
        to Redis when this store's flight ends (``hand_back``): since ``now``, or since the
        row's last write by Redis when later (Redis's clock, that of the records the recorder
        compares it with: an idle record made before that flight opened must not clear it)."""
        self.beside = max(now, self.updated or 0) if beside and self.state != IDLE else None
        self.pending = 0
        self.payload = None
        self.first = self.last = self.anchor = self.due = None
        self.due_fixed = False
        self.attempt = 0
        self.not_before = None
        self.taken = False
        self.taken_at = None
        self.end_run()
        self.extra = {"watchdog_at": None, "merge_until": None}

    def hand_back(self, now: int) -> bool:
        """This store's flight ended and Redis may hold a flight of the key that the row does
        not record (``beside``: the row was taken over from a live Redis flight, or Redis
        opened one while this store held the row, and no idle record of Redis came later):
        the row goes back to the Redis store as a flight of one trigger, due now, to recheck
        now. The recheck (``RedisBackend.recheck``) brings it to what Redis holds, or, when
        Redis lost that state, rebuilds and runs the flight (at least once, docs/design.md
        "Failover"). Returns whether it was handed back."""
        if self.beside is None or self.pending or self.running_until is not None:
            return False
        payload = self.payload if self.payload is not None else self.last_payload
        self.handed = True
        self.flight_id += 1
        self.pending = 1
        self.triggers += 1
        self.first = self.last = self.anchor = self.due = now
        self.bound = None
        self.due_fixed = False
        self.taken = False
        self.taken_at = None
        self.attempt = self.attempted = 0
        self.not_before = None
        self.payload = [] if self.cfg.collect else payload
        self.beside = now
        return True

    # -- operations (KeyModel's) -------------------------------------------------------------

    def trigger(self, now: int, payload_json: str) -> tuple[str, Msg | None]:
        """Twin of trigger.lua and KeyModel.trigger. Returns ``(how, message)``: how is
        ``merged`` (a plain merge: the entry stays), ``dropped`` or ``counted``."""
        cfg = self.cfg
        wait, max_wait = cfg.wait, cfg.max_wait
        if self.is_plain_merge(now):
            assert self.due is not None and self.anchor is not None
            self.pending += 1
            self.triggers += 1
            self.last = now
            self.payload = payload_json
            if max_wait is not None:
                self.bound = _min(self.bound, self.anchor + max_wait)
            if not self.due_fixed:
                due = now + wait
                if self.bound is not None:
                    due = min(due, self.bound)
                self.due = max(due, self.due)
            if self.not_before is not None:
                self.due = max(self.due, self.not_before)
            return "merged", None
        self.recover_lease(now)
        opened = self.pending == 0
        if opened:
            edge = self.edge(now, wait, max_wait)
            if edge == "drop":
                # trailing=False: inside the window of a leading run (lodash drops it)
                self.triggers += 1
                self.cancelled += 1
                self.last = now
                return "dropped", None
            self.flight_id += 1
            self.first = now
            self.anchor = self.anchor_at(now, wait, max_wait)
            self.bound = None
            self.payload = [] if cfg.collect else None
            self.due_fixed = edge == "leading"
            self.attempt = 0
            self.attempted = 0
            self.not_before = None
            self.taken = False
            self.taken_at = None
        self.pending += 1
        self.triggers += 1
        self.last = now
        full = False
        if cfg.collect:
            assert cfg.collect_limit is not None
            item = json.loads(payload_json)
            items = list(self.payload or [])
            if dumps(item) not in {dumps(i) for i in items}:
                items.append(item)
            self.payload = items
            full = len(items) >= cfg.collect_limit
        else:
            self.payload = payload_json
        if max_wait is not None and self.anchor is not None:
            # the flight's bound: the smallest anchor + max_wait among its triggers
            self.bound = _min(self.bound, self.anchor + max_wait)
        if self.due_fixed and not opened:
            assert self.due is not None
            due = self.due  # a leading or full flight is not delayed by later triggers
        elif self.due_fixed or full:
            due = now
        else:
            assert self.anchor is not None
            due = now + wait
            if self.bound is not None:
                due = min(due, self.bound)
            if not opened and self.due is not None:
                # never earlier than the due time given to the flight's earlier triggers (I3):
                # a lost or retried run that rejoined it brought an older first trigger
                due = max(due, self.due)
        if full:
            self.due_fixed = True
        if self.not_before is not None and due < self.not_before:
            due = self.not_before  # a retry's backoff: later triggers join the retry
        self.due = due
        msg = None
        if self.live() and not cfg.overlap:
            pass  # the finishing run schedules the flight; the lease end is in the index
        elif not self.taken or (self.taken_at is not None and self.taken_at > due):
            # no message out, or the one out is for a later time (a collected flight that
            # became full): the flight is scheduled anew
            msg = self.schedule(due, now)
        return "counted", msg

    def take(self, now: int) -> tuple[Msg | None, bool]:
        """Twin of take.lua and KeyModel.take: the entry is due."""
        self.recover_lease(now)
        msg, again = None, False
        if self.pending and (not self.live() or self.cfg.overlap):
            assert self.due is not None
            if self.due <= now:
                if self.taken:
                    again = True  # the message out was not claimed within retake
                else:
                    self.next_seq(now)
                self.taken = True
                self.taken_at = now
                msg = (self.seq, 0)
        return msg, again

    def release(self, seq: int) -> bool:
        """Twin of release.lua and KeyModel.release."""
        if not self.taken or self.seq != seq:
            return False
        self.taken = False
        self.taken_at = None
        return True

    def fire(self, now: int, seq: int | None) -> tuple[str, Msg | None, dict[str, Any] | None]:
        """Twin of fire.lua and KeyModel.fire. Returns ``(action, message, claim)``."""
        cfg = self.cfg
        self.recover_lease(now)
        if seq is not None and (seq != self.seq or not self.taken):
            return "drop", None, None
        if self.pending == 0:
            self.taken = False
            self.taken_at = None
            return "drop", None, None
        assert self.due is not None
        if now < self.due:
            # early (the flight moved later after its message went out): back to the index,
            # or out again at once when due within `direct`
            return "rearm", self.schedule(self.due, now), None
        if self.live() and not cfg.overlap:
            # the finishing run schedules this flight; the live run's lease end is indexed
            self.taken = False
            self.taken_at = None
            return "wait", None, None
        self.run_id += 1
        payload, rest = self.payload, None
        cut = False
        if cfg.collect and isinstance(payload, list):
            took = cfg.batch(payload)
            if took < len(payload):
                payload, rest = payload[:took], payload[took:]
                cut = took < (cfg.collect_limit or 0)
        claimed = self.pending - (len(rest) if rest else 0)
        claim = {
            "run_id": self.run_id,
            "flight_id": self.flight_id,
            "triggers": claimed,
            "payload": copy.deepcopy(payload),
            "first": self.first,
            "last": self.last,
            "due": self.due,
            "attempt": self.attempt,
        }
        self.running_until = now + cfg.lease
        self.run_seq = seq or 0
        self.run_triggers = claimed
        self.run_payload = copy.deepcopy(payload)
        self.run_first = self.first
        self.run_anchor = self.anchor
        self.run_bound = self.bound
        self.run_attempt = self.attempt
        # the attempted triggers (collect: items) come first, so the run takes them first
        size = len(payload or []) if cfg.collect else claimed
        self.run_attempted = min(self.attempted, size)
        self.attempted -= self.run_attempted
        claim["attempted"] = self.run_attempted
        self.runs += 1
        self.merged += claimed - 1
        self.attempt = 0
        self.not_before = None
        self.taken = False
        self.taken_at = None
        self.last_run_at = now
        follow = None
        if rest:
            assert cfg.collect_limit is not None
            self.flight_id += 1
            self.pending = len(rest)
            self.payload = rest
            self.due_fixed = len(rest) >= cfg.collect_limit or cut
            if self.due_fixed:
                self.due = now
            if cfg.overlap:
                assert self.due is not None
                follow = self.schedule(self.due, now)
        else:
            self.pending = 0
            self.payload = None
            self.first = None
            self.anchor = None
            self.bound = None
            self.due = None
            self.due_fixed = False
            self.attempted = 0
        return "claim", follow, claim

    def finish(
        self, now: int, run_id: int, ok: bool, retry_in: int | None, give_up: bool = False
    ) -> Msg | None:
        """Twin of finish.lua and KeyModel.finish."""
        lost = self.recover_lease(now)
        if not self.current(run_id):
            # a late finisher after its lease ran out changes nothing; when it recovered the
            # lost run itself, it schedules that flight
            if lost and self.pending and not self.live() and not self.taken:
                assert self.due is not None
                return self.schedule(max(self.due, now), now)
            return None
        if not ok and retry_in is not None:
            attempt = self.run_attempt + 1
            self.unclaim(now)
            self.attempt = attempt
            self.not_before = now + retry_in
            self.due = max(self.due if self.due is not None else now, self.not_before)
            self.due_fixed = False
        elif give_up and 0 < self.run_attempted < self.run_size():
            self.give_up(now)
        else:
            self.end_run()
        msg = None
        if self.pending:
            assert self.due is not None
            at = max(self.due, now)
            if not self.taken or (self.taken_at is not None and self.taken_at > at):
                msg = self.schedule(at, now)
        return msg

    def heartbeat(self, now: int, run_id: int, lease: int) -> bool:
        """Twin of heartbeat.lua and KeyModel.heartbeat (a lease that ran out is not)."""
        if not self.current(run_id):
            return False
        assert self.running_until is not None
        if self.running_until <= now:
            return False
        self.running_until = now + lease
        return True

    def extend(self, now: int, seq: int, lease: int) -> int | None:
        """Twin of extend.lua and KeyModel.extend."""
        if self.running_until is None or self.run_seq != seq or not seq:
            return None
        if self.running_until <= now:
            return None
        self.running_until = now + lease
        return self.running_until

    def flush(self, now: int) -> tuple[bool, Msg | None]:
        """Twin of flush.lua and KeyModel.flush. Returns ``(changed, message)``."""
        if self.pending == 0:
            return False, None
        self.due = now
        self.not_before = None
        msg = None
        if self.live() and not self.cfg.overlap:
            self.taken = False
            self.taken_at = None
        else:
            msg = self.schedule(now, now)
        return True, msg

    def cancel(self, now: int) -> int:
        """Twin of cancel.lua and KeyModel.cancel (lodash's cancel(): the next trigger starts
        a new burst)."""
        self.last = None
        dropped = self.pending
        if dropped:
            self.cancelled += dropped
            self.pending = 0
            self.payload = None
            self.first = self.anchor = self.bound = self.due = None
            self.due_fixed = False
            self.attempt = 0
            self.attempted = 0
            self.not_before = None
            self.next_seq(now)  # any message out is now stale
            self.taken = False
            self.taken_at = None
        return dropped


# Two clocks far apart (microseconds) at which a new key's opening is worked out (_opening).
_T1, _T2 = 1_700_000_000_000_000, 1_800_000_000_123_457
_PAYLOAD = "\x00payload"  # stands for the call's payload


def _opening(cfg: _Cfg, retake: int, direct: int) -> Opening | None:
    """A trigger on a key that has no row, as ``Sql.merge`` makes it: ``_Key.trigger`` (the
    rule itself, not a copy) applied to the row ``DebounceKey`` defaults to, at two clocks
    far apart. A new key's opening moves with the clock: each written column is the same at
    both (a constant), or the clock plus the same microseconds at both (its times, the
    message's sequence number), so the statement writes it with its own clock. ``None`` when
    it is not (a rule that depends on the clock otherwise): such a key takes the locked step.
    Not for collect mode (its merge is never one statement)."""
    if cfg.collect:
        return None
    fields = {f.column: f for f in DebounceKey._meta.concrete_fields}
    head = {"key_hash": "kh", "key": "key", "task_name": "task"}
    out: list[Any] = []
    for clock in (_T1, _T2):
        row: list[Any] = [None, "", "", ""]
        row += [fields[col].get_default() for _a, col, _k in FIELDS]
        k = _Key(row, cfg, retake, direct)
        how, msg = k.trigger(clock, _PAYLOAD)
        if how != "counted":
            return None
        cols, values = k.changes()
        entry = k.attention()
        if entry is None:
            return None
        changed = dict(zip(cols, values, strict=True))
        countdown = None if msg is None else msg[1]
        seq = None if msg is None else msg[0] - clock
        out.append((changed, entry - clock, countdown, seq, k.seq - clock))
    (a, entry, countdown, seq, _s), (b, entry2, countdown2, seq2, _s2) = out
    if a.keys() != b.keys() or (entry, countdown, seq) != (entry2, countdown2, seq2):
        return None
    if msg is not None and seq != out[0][4]:
        return None  # the message carries the row's sequence number
    columns: list[tuple[str, str, Any]] = []
    for f in DebounceKey._meta.concrete_fields:
        col = f.column
        if f.primary_key or (f.null and col not in a):
            continue  # its default: NULL, or the database's
        if col in head:
            columns.append((col, "param", head[col]))
        elif col in ("created_at", "updated_at"):
            columns.append((col, "now", 0))
        elif col not in a:
            columns.append((col, "const", f.get_default()))
        elif a[col] == _PAYLOAD and b[col] == _PAYLOAD:
            columns.append((col, "param", "payload"))
        elif a[col] == b[col] and KINDS[col] != TIME:
            columns.append((col, "const", a[col]))
        elif isinstance(a[col], int) and isinstance(b[col], int) and a[col] - _T1 == b[col] - _T2:
            columns.append((col, "now", a[col] - _T1))
        else:
            return None
    return Opening(tuple(columns), entry, countdown)


def registered_options() -> dict[str, FlightOptions]:
    """Task name -> options of every debounced task registered in this process."""
    from django_debounce.tasks import registered_debounced_tasks

    return {task.name: task.flight_options() for task in registered_debounced_tasks()}


def _json_value(value: Any) -> Any:
    """A payload as the task body gets it (collected items are already values)."""
    return json.loads(value) if isinstance(value, str) else value


class DatabaseBackend(BaseBackend):
    """Row-lock store on PostgreSQL or SQLite."""

    name = "database"
    store = "d"
    MANY = 500  # triggers per transaction of trigger_many
    # Set by the auto store: whether a Redis store may hold flights beside this one (rows the
    # database store took over go back to Redis when its flight ends: _Key.hand_back).
    redis_beside: Callable[[], bool] | None = None

    def beside_redis(self) -> bool:
        """Whether a Redis store works beside this one (the ``auto`` store with Redis)."""
        return self.redis_beside is not None and self.redis_beside()

    # -- plumbing ---------------------------------------------------------------------------

    @property
    def alias(self) -> str:
        return router.db_for_write(DebounceKey)

    def _sql(self, conn: Any) -> Sql:
        """Statement texts of ``conn``'s vendor (kept per alias)."""
        cache = self.__dict__.setdefault("_sql_cache", {})
        sql = cache.get(conn.alias)
        if sql is None:
            if conn.vendor not in ("postgresql", "sqlite"):
                raise ImproperlyConfigured(
                    f"The database store runs on PostgreSQL or SQLite; the database "
                    f"{conn.alias!r} is {conn.vendor}. Use DEBOUNCE_BACKEND='redis', or route "
                    "django_debounce's tables to a PostgreSQL or SQLite database."
                )
            sql = cache[conn.alias] = Sql(conn.vendor, partial(adapt_time, conn.ops))
        return sql

    def _fast(self, conn: Any, sql: Sql) -> bool:
        """Whether ``conn`` takes the PostgreSQL fast path: psycopg 3 with pipeline mode,
        outside any atomic block of the caller (a failed statement there would abort the
        caller's transaction, and ``_again`` could not run the step again), and prepared
        statements wanted (``_prepares``)."""
        return (
            sql.pg
            and not conn.in_atomic_block
            and self._prepares(conn)
            and _prepared_cursor() is not None
        )

    def _prepares(self, conn: Any) -> bool:
        """``DEBOUNCE_DATABASE_PREPARE``; when ``None`` (the default), yes unless the
        database's ``DISABLE_SERVER_SIDE_CURSORS`` is set (what Django asks of a database
        behind PgBouncer in transaction mode). No for good on a database whose server lost a
        prepared statement (``_again``)."""
        if conn.alias in self._unprepared:
            return False
        wanted = conf.get("DATABASE_PREPARE")
        if wanted is None:
            return not conn.settings_dict.get("DISABLE_SERVER_SIDE_CURSORS")
        return bool(wanted)

    @property
    def _unprepared(self) -> set[str]:
        """Aliases of the databases whose server lost a prepared statement (``_again``)."""
        return self.__dict__.setdefault("_unprepared_aliases", set())  # type: ignore[no-any-return]

    def _again(self, step: Callable[[], Any]) -> Any:
        """Run ``step``; when the server lost one of its prepared statements (a pooler that
        moved this client to another server session: PgBouncer in transaction mode before
        1.21, or with ``max_prepared_statements = 0``), stop preparing statements on that
        database in this process, log it once, and run ``step`` again, unprepared. Safe: the
        failed statement ran alone in autocommit or in the step's own transaction, which was
        rolled back (``_fast`` is never true inside a caller's atomic block)."""
        try:
            return step()
        except DatabaseError as exc:
            if not _lost_prepared(exc):
                raise
            alias = self.alias
            self._unprepared.add(alias)
            logger.warning(
                "django_debounce: the database %r lost a prepared statement (%s); the "
                "database store stops preparing its statements there. Behind PgBouncer in "
                "transaction mode set DEBOUNCE_DATABASE_PREPARE = False or the database's "
                "DISABLE_SERVER_SIDE_CURSORS = True",
                alias,
                exc,
            )
            return step()

    def _cursor(self, conn: Any, sql: Sql) -> Any:
        """A cursor of ``conn`` (Django's wrapper: its errors, query log and execute
        wrappers). On the fast path its statements are prepared: bound and planned on the
        server once per connection, not parsed and planned at every call (a merge costs
        about 100 µs less)."""
        if not self._fast(conn, sql):
            return conn.cursor()
        conn.ensure_connection()
        raw = conn.connection
        factory = raw.cursor_factory
        raw.cursor_factory = _prepared_cursor()
        try:
            return conn.cursor()
        finally:
            raw.cursor_factory = factory

    @contextmanager
    def _step(self, conn: Any, sql: Sql, *, lock: bool = True) -> Iterator[Any]:
        """The transaction of one step and its cursor. On the fast path outside any atomic
        block, the transaction is sent in psycopg's pipeline mode: ``BEGIN`` goes with the
        step's first statement and ``COMMIT`` with its last writes, so a step that locks and
        reads its row, then writes, costs two round trips, not four. Elsewhere (SQLite, a
        caller's atomic block): ``transaction.atomic``, and SQLite's write lock taken first
        (``_begin``) unless ``lock`` is false (the step's first statement is a write)."""
        if not self._fast(conn, sql) or conn.in_atomic_block or not conn.get_autocommit():
            with transaction.atomic(using=conn.alias), self._cursor(conn, sql) as cursor:
                if lock:
                    self._begin(conn, sql, cursor)
                yield cursor
            return
        with self._cursor(conn, sql) as cursor, conn.wrap_database_errors:
            raw = conn.connection
            try:
                with raw.pipeline():
                    cursor.cursor.execute("BEGIN", prepare=False)
                    yield cursor
                    cursor.cursor.execute("COMMIT", prepare=False)
            except BaseException:
                try:
                    if raw.pgconn.transaction_status != _IDLE:
                        raw.rollback()
                except Exception:
                    conn.errors_occurred = True  # Django closes an unusable connection
                raise

    def _opening(self, conn: Any, sql: Sql, cfg: _Cfg) -> Opening | None:
        """A new key's opening folded into the merge statement (module function ``_opening``),
        kept per options; only on the fast path (its one statement is long: prepared)."""
        if not self._fast(conn, sql):
            return None
        cache = self.__dict__.setdefault("_opening_cache", {})
        try:
            return cache[cfg]  # type: ignore[no-any-return]
        except KeyError:
            retake, direct = self._limits()
            found = cache[cfg] = _opening(cfg, retake, direct)
            return found

    KNOWN = 4096  # key hashes a process remembers as having a row (_saw)

    def _saw(self, key_hash: str) -> None:
        """Remember that ``key_hash`` has a row: its next trigger in this process tries the
        plain merge alone (``trigger``). A hint only: a row gone since (purged) makes the
        merge find nothing, and the locked step makes it again."""
        known = self.__dict__.setdefault("_known", set())
        if len(known) >= self.KNOWN:
            known.clear()
        known.add(key_hash)

    def _limits(self) -> tuple[int, int]:
        """Retake (DEBOUNCE_DISPATCH_GRACE) and direct (DEBOUNCE_PUMP_INTERVAL) windows in
        microseconds, read once per instance (rebuilt when a ``DEBOUNCE_`` setting changes)."""
        limits = self.__dict__.get("_limits_cache")
        if limits is None:
            limits = self.__dict__["_limits_cache"] = (
                int(round(conf.seconds_of("DISPATCH_GRACE") * US)),
                int(round(conf.seconds_of("PUMP_INTERVAL") * US)),
            )
        return limits

    def _begin(self, conn: Any, sql: Sql, cursor: Any) -> None:
        """SQLite with deferred transactions: take the write lock with the first statement."""
        if not sql.pg and getattr(conn, "transaction_mode", None) not in ("IMMEDIATE", "EXCLUSIVE"):
            cursor.execute(sql.write_lock)

    def _load(
        self,
        cursor: Any,
        sql: Sql,
        key_hash: str,
        options: FlightOptions | None,
        now: Any,
        create: tuple[str, str] | None = None,
    ) -> tuple[_Key | None, int]:
        """Lock and read the row of ``key_hash`` (made first when ``create``, ``(key,
        task_name)``, is given and there is none); returns it and now in microseconds.
        ``options=None``: a step that needs none of them but the row's ``overlap``."""
        retake, direct = self._limits()
        row = None
        if create is not None:
            # the row's creation times are rewritten by the step's writes (updated_at)
            clock = to_us(now) if now is not None else time.time_ns() // 1000
            assert clock is not None
            new = sql.new_key(create[0], key_hash, create[1], clock)
            if sql.pg:  # one statement for a new row and an existing one alike
                cursor.execute(sql.insert_or_select_key, [*new, key_hash])
                row = cursor.fetchone()
            else:  # SQLite: the insert is the first statement (takes the write lock at once)
                cursor.execute(sql.insert_key, new)
        if row is None:
            cursor.execute(sql.select_key, [key_hash])
            row = cursor.fetchone()
        if row is None and create is not None:
            clock = to_us(now) if now is not None else None
            if clock is None:
                clock = to_us(self._clock(cursor, sql))
            assert clock is not None
            cursor.execute(sql.insert_key, sql.new_key(create[0], key_hash, create[1], clock))
            cursor.execute(sql.select_key, [key_hash])
            row = cursor.fetchone()
        if now is not None:
            at = to_us(now)
        elif sql.pg and row is not None:
            at = to_us(row[0])
        else:
            at = time.time_ns() // 1000
        assert at is not None
        if row is None:
            return None, at
        return _Key(row[1:], _cfg(options) if options is not None else None, retake, direct), at

    def _clock(self, cursor: Any, sql: Sql) -> Any:
        if sql.pg:
            cursor.execute("SELECT clock_timestamp()")
            return cursor.fetchone()[0]
        return to_dt(time.time_ns() // 1000)

    def _now_us(self, cursor: Any, sql: Sql, now: Any) -> int:
        at = to_us(now) if now is not None else to_us(self._clock(cursor, sql))
        assert at is not None
        return at

    def _collect(self, w: Writes, sql: Sql, k: _Key, now: int, *, reindex: bool = True) -> None:
        """Add the writes of ``k``'s step to ``w``: its changed columns, its index entry
        (``KeyModel._reindex``), and the runs it lost. A row whose flight ended goes back to
        the Redis store when Redis may hold a flight beside it (``_Key.hand_back``)."""
        handed = k.beside is not None and self.beside_redis() and k.hand_back(now)
        cols, values = k.changes()
        if cols:
            kinds = KINDS
            params = [
                sql.time(v) if kinds[c] == TIME else v for c, v in zip(cols, values, strict=True)
            ]
            w.keys.append((k.pk, (*cols, "updated_at"), [*params, sql.time(now)]))
        if reindex or handed:
            entry = None if handed else k.attention()
            if entry is None:
                w.unindex.append(k.key_hash)
            else:
                w.index.append((k.key_hash, k.task_name, sql.time(entry)))
        for run_id in k.events:
            w.runs_end.append((k.pk, run_id, LOST, sql.time(now), "lease ran out"))
        k.events = []

    def _dispatch(
        self, key_hash: str, msg: Msg | None, task_name: str, label: str = ""
    ) -> Dispatch | None:
        if msg is None:
            return None
        if len(label) > LABEL:
            label = label[: LABEL - 1] + "…"  # as dispatch.publish cuts it
        return Dispatch(key_hash, msg[0], msg[1] / US, self.store, task_name, label)

    # -- triggers ---------------------------------------------------------------------------

    @_retrying
    def trigger(
        self, *, task_name, key, key_hash, payload_json, options, now=None, unopened=frozenset()
    ):
        """``BaseBackend.trigger``; ``unopened``: key hashes whose Redis flight surely does
        not exist (the ``auto`` store's failed trigger: ``errors.mark_unopened``)."""
        conn = connections[self.alias]
        sql = self._sql(conn)
        cfg = _cfg(options)
        if sql.pg and not cfg.collect:
            # the hot path: a plain merge is one statement (see Sql.merge); so is a new key's
            # opening on the fast path, folded into it for keys this process has not seen
            # lately (a longer statement: ~25 us more for a merge)
            known = self.__dict__.setdefault("_known", set())
            opening = None if key_hash in known else self._opening(conn, sql, cfg)
            params = [payload_json, cfg.wait, cfg.max_wait, key_hash]
            if opening is not None:
                params += [key, task_name]
            with self._cursor(conn, sql) as cursor:
                if now is not None:
                    cursor.execute(sql.merge(True, opening), [now, *params])
                else:
                    cursor.execute(sql.merge(False, opening), params)
                done = cursor.fetchone()
            if done is not None:
                self._saw(key_hash)
                due_at = done[-1 if opening is None else 3]
                if due_at is not None and due_at.tzinfo is None:  # USE_TZ = False
                    done = [from_db(v) if isinstance(v, datetime) else v for v in done]
            if done is not None and opening is None:
                flight_id, pending, due_at = done
                return TriggerResult(key, flight_id, pending, due_at, False), None
            if done is not None and opening is not None:
                merged, flight_id, pending, due_at, seq = done
                if merged:
                    return TriggerResult(key, flight_id, pending, due_at, False), None
                msg = None if opening.countdown is None else (seq, opening.countdown)
                dispatch = self._dispatch(key_hash, msg, task_name, key)
                result = TriggerResult(key, flight_id, pending, due_at, dispatch is not None)
                return result, dispatch
        with self._step(conn, sql, lock=False) as cursor:
            k, at = self._load(cursor, sql, key_hash, options, now, create=(key, task_name))
            assert k is not None
            if k.store != "database":
                k.adopt(at, key_hash not in unopened and self.beside_redis())
            how, msg = k.trigger(at, payload_json)
            w = Writes()
            self._collect(w, sql, k, at, reindex=how != "merged")
            sql.run(cursor, w)
        self._saw(key_hash)
        if how == "dropped":
            return TriggerResult(key, k.flight_id, 0, None, False, dropped=True), None
        dispatch = self._dispatch(key_hash, msg, task_name, key)
        result = TriggerResult(key, k.flight_id, k.pending, to_dt(k.due), dispatch is not None)
        return result, dispatch

    def trigger_many(self, *, task_name, items, options, now=None, unopened=frozenset()):
        """``trigger`` for each ``(key, key_hash, payload_json)`` of ``items``, in order, in
        one transaction per ``MANY`` items: the missing rows made in one statement, all rows
        locked and read in one (in key-hash order, so concurrent batches never deadlock),
        each trigger applied to its row in memory (``_Key.trigger``, as ``trigger`` does),
        and the writes sent as one statement on PostgreSQL (``Sql.run``). The triggers of a
        batch share one clock reading. Results and dispatches are those of the same triggers
        made one by one. ``unopened``: as for ``trigger``."""
        conn = connections[self.alias]
        sql = self._sql(conn)
        cfg = _cfg(options)
        out: list[tuple[TriggerResult, Dispatch | None]] = []
        for start in range(0, len(items), self.MANY):
            out += self._again(
                partial(
                    self._trigger_chunk,
                    conn,
                    sql,
                    task_name,
                    items[start : start + self.MANY],
                    cfg,
                    now,
                    unopened,
                )
            )
        return out

    def _trigger_chunk(
        self,
        conn: Any,
        sql: Sql,
        task_name: str,
        chunk: Sequence[tuple[str, str, str]],
        cfg: _Cfg,
        now: Any,
        unopened: frozenset[str],
    ) -> list[tuple[TriggerResult, Dispatch | None]]:
        """One transaction of ``trigger_many``: the results of ``chunk``."""
        retake, direct = self._limits()
        out: list[tuple[TriggerResult, Dispatch | None]] = []
        keys = dict(sorted({hashed: key for key, hashed, _p in chunk}.items()))
        with self._step(conn, sql) as cursor:
            at = self._now_us(cursor, sql, now)
            rows = [sql.new_key(key, hashed, task_name, at) for hashed, key in keys.items()]
            cursor.execute(sql.insert_keys(len(rows)), [v for row in rows for v in row])
            cursor.execute(sql.select_keys(len(keys)), sql.names_param(list(keys)))
            held = {
                k.key_hash: k for k in (_Key(row, cfg, retake, direct) for row in cursor.fetchall())
            }
            counted: set[str] = set()
            adopted: set[str] = set()
            beside = self.beside_redis()
            for key, hashed, payload_json in chunk:
                k = held[hashed]
                if k.store != "database" and hashed not in adopted:
                    # once: its store column changes with the writes below
                    k.adopt(at, beside and hashed not in unopened)
                    adopted.add(hashed)
                how, msg = k.trigger(at, payload_json)
                if how != "merged":
                    counted.add(hashed)  # its index entry is written (as trigger's)
                if how == "dropped":
                    dropped = TriggerResult(key, k.flight_id, 0, None, False, dropped=True)
                    out.append((dropped, None))
                    continue
                dispatch = self._dispatch(hashed, msg, task_name, key)
                result = TriggerResult(
                    key, k.flight_id, k.pending, to_dt(k.due), dispatch is not None
                )
                out.append((result, dispatch))
            w = Writes()
            for hashed, k in held.items():
                self._collect(w, sql, k, at, reindex=hashed in counted)
            sql.run(cursor, w)
        return out

    # -- the pump ---------------------------------------------------------------------------

    def _names(self, task_names: Sequence[str] | None) -> list[str]:
        return sorted(task_names) if task_names is not None else sorted(registered_options())

    def peek(self, task_names, *, now=None):
        names = self._names(task_names)
        if not names:
            return None
        conn = connections[self.alias]
        sql = self._sql(conn)
        with conn.cursor() as cursor:
            cursor.execute(sql.first_entry(len(names)), [names] if sql.pg else names)
            first, clock = cursor.fetchone()
        if first is None:
            return None
        at = to_us(now) if now is not None else (to_us(clock) if sql.pg else None)
        if at is None:
            at = time.time_ns() // 1000
        return (to_us(first) - at) / US  # type: ignore[operator]

    @_retrying
    def take(self, tasks, limit, *, now=None):
        tasks = dict(tasks) if tasks is not None else registered_options()
        names = sorted(tasks)
        if not names or limit <= 0:
            return Taken(next_in=self.peek(names, now=now) if names else None)
        conn = connections[self.alias]
        sql = self._sql(conn)
        retake, direct = self._limits()
        dispatches: list[Dispatch] = []
        again = 0
        with self._step(conn, sql) as cursor:
            at = self._now_us(cursor, sql, now)
            when = sql.time(at)
            if sql.pg:
                cursor.execute(sql.take(len(names)), [names, when, limit, limit])
            else:
                cursor.execute(sql.take(len(names)), [*names, when, limit])
            rows = cursor.fetchall()
            if not rows:
                before = sql.time(at - US)
                cursor.execute(
                    sql.orphans(len(names)), [names, before] if sql.pg else [*names, before]
                )
            w = Writes()
            batch: list[str] = []
            entries: list[int] = []
            for row in rows:
                task = row[0]
                k = _Key(row[2:], _cfg(tasks[task]), retake, direct)
                batch.append(k.key_hash)
                if k.store != "database":
                    w.unindex.append(k.key_hash)  # the key went back to Redis
                    continue
                msg, retaken = k.take(at)
                again += retaken
                self._collect(w, sql, k, at)
                entry = k.attention()
                if entry is not None:
                    entries.append(entry)
                if msg is not None:
                    dispatch = self._dispatch(k.key_hash, msg, task, k.key)
                    assert dispatch is not None
                    dispatches.append(dispatch)
            # the earliest entry left: this batch's new ones, and the others (PostgreSQL
            # reads them in the snapshot before the batch's writes, so the batch is left out)
            if sql.pg:
                final = sql.first_entry(len(names), excluding=True), [names, batch]
            else:
                final = sql.first_entry(len(names)), names
            first = sql.run(cursor, w, final)
        left = to_us(first[0]) if first is not None else None
        if sql.pg and left is not None and entries:
            left = min(left, min(entries))
        elif sql.pg and entries:
            left = min(entries)
        next_in = None if left is None else (left - at) / US
        return Taken(dispatches, again, next_in)

    @_retrying
    def release(self, dispatches, *, now=None):
        conn = connections[self.alias]
        sql = self._sql(conn)
        by_key = sorted(dispatches, key=lambda d: d.key_hash)  # one lock order
        with self._step(conn, sql) as cursor:
            w = Writes()
            for dispatch in by_key:
                k, at = self._load(cursor, sql, dispatch.key_hash, None, now)
                if k is None or k.store != "database":
                    continue
                if k.release(dispatch.seq):
                    self._collect(w, sql, k, at)
            sql.run(cursor, w)

    # -- the worker -------------------------------------------------------------------------

    @_retrying
    def fire(self, key_hash, seq, *, task_name, options, now=None, store=None):
        conn = connections[self.alias]
        sql = self._sql(conn)
        with self._step(conn, sql) as cursor:
            k, at = self._load(cursor, sql, key_hash, options, now)
            if k is None:
                return FireDecision(FireAction.MISSING)
            if k.store != "database" and seq is not None:
                return FireDecision(FireAction.DROP)  # a message of the Redis store's flight
            action, msg, claim = k.fire(at, seq)
            w = Writes()
            self._collect(w, sql, k, at)
            if claim is not None:
                last = claim["last"] if claim["last"] is not None else at
                first = claim["first"] if claim["first"] is not None else last
                due = claim["due"] if claim["due"] is not None else at
                w.runs_new.append(
                    [
                        k.pk,
                        k.task_name,
                        "database",
                        claim["flight_id"],
                        claim["run_id"],
                        claim["attempt"],
                        claim["triggers"],
                        sql.time(first),
                        sql.time(last),
                        sql.time(due),
                        sql.time(at),
                        max(at - last, 0) / US,
                        RUNNING,
                        "",
                    ]
                )
            sql.run(cursor, w)
        dispatch = self._dispatch(key_hash, msg, task_name, k.key)
        if claim is None:
            return FireDecision(FireAction(action), dispatch=dispatch)
        payload = claim["payload"] if k.cfg.collect else _json_value(claim["payload"])
        return FireDecision(
            FireAction.CLAIM,
            dispatch=dispatch,
            claim=Claim(
                key_hash=key_hash,
                key=k.key,
                task_name=k.task_name,
                run_id=claim["run_id"],
                flight_id=claim["flight_id"],
                triggers=claim["triggers"],
                payload=payload,
                first_trigger_at=to_dt(first),  # type: ignore[arg-type]
                last_trigger_at=to_dt(last),  # type: ignore[arg-type]
                due_at=to_dt(due),  # type: ignore[arg-type]
                started_at=to_dt(at),  # type: ignore[arg-type]
                store=self.store,
                attempt=claim["attempt"],
                attempted=claim["attempted"],
            ),
        )

    @_retrying
    def finish(self, key_hash, run_id, end, *, task_name, options, now=None, store=None):
        if end.ok:
            outcome = SUCCESS
        elif end.retry_in is not None:
            outcome = RETRY
        else:
            outcome = FAILURE
        retry = None if end.ok or end.retry_in is None else int(round(max(end.retry_in, 0) * US))
        conn = connections[self.alias]
        sql = self._sql(conn)
        with self._step(conn, sql) as cursor:
            k, at = self._load(cursor, sql, key_hash, options, now)
            if k is None or k.store != "database":
                return None
            started = to_us(end.started_at) if end.started_at is not None else None
            other = k.current(run_id) and started is not None and k.last_run_at != started
            applies = not other and k.current(run_id) and k.running_until > at  # type: ignore[operator]
            k.covered = None
            # the finish of another run with this id (finish.lua's fence; run ids of this
            # store are never handed out twice) changes nothing, as a late finisher's
            msg = k.finish(at, -1 if other else run_id, end.ok, retry, end.give_up)
            if applies:
                k.last_outcome = outcome
            w = Writes()
            if run_id not in k.events and not other:
                # the run's record gets its outcome (a run an overlapping claim superseded
                # too: its record is still marked running); a lost run's says so already
                w.runs_end.append((k.pk, run_id, outcome, sql.time(at), end.error))
            self._collect(w, sql, k, at)
            sql.run(cursor, w)
            if k.covered is not None:  # a give-up covers only the attempted triggers
                cursor.execute(sql.run_triggers, [k.covered, k.pk, run_id])
        return self._dispatch(key_hash, msg, task_name, k.key)

    @_retrying
    def heartbeat(self, key_hash, run_id, lease, *, task_name, options, now=None, store=None):
        conn = connections[self.alias]
        sql = self._sql(conn)
        with self._step(conn, sql) as cursor:
            k, at = self._load(cursor, sql, key_hash, options, now)
            if k is None or k.store != "database":
                return False
            if not k.heartbeat(at, run_id, int(round(lease * US))):
                return False
            w = Writes()
            self._collect(w, sql, k, at)
            sql.run(cursor, w)
        return True

    @_retrying
    def extend(self, runs, *, now=None):
        if not runs:
            return []
        conn = connections[self.alias]
        sql = self._sql(conn)
        retake, _direct = self._limits()
        order = sorted(range(len(runs)), key=lambda i: (runs[i].key_hash, runs[i].seq))
        if sql.pg:
            params: list[Any] = [
                [runs[i].key_hash for i in order],
                [runs[i].seq for i in order],
                [int(round(runs[i].lease * US)) for i in order],
                [runs[i].options.overlap for i in order],
                retake,
            ]
            with self._cursor(conn, sql) as cursor:
                if now is not None:
                    cursor.execute(sql.extend(True), [now, *params])
                else:
                    cursor.execute(sql.extend(False), params)
                got = {(h, seq): (until, clock) for h, seq, until, clock in cursor.fetchall()}
            out: list[float | None] = []
            for run in runs:
                hit = got.get((run.key_hash, run.seq))
                out.append(None if hit is None else (to_us(hit[0]) - to_us(hit[1])) / US)  # type: ignore[operator]
            return out
        results: dict[int, float | None] = {}
        with self._step(conn, sql) as cursor:
            w = Writes()
            for i in order:
                live: LiveRun = runs[i]
                k, at = self._load(cursor, sql, live.key_hash, live.options, now)
                results[i] = None
                if k is None or k.store != "database":
                    continue
                until = k.extend(at, live.seq, int(round(live.lease * US)))
                if until is None:
                    continue
                results[i] = (until - at) / US
                self._collect(w, sql, k, at)
                # a later run of the same key in this batch reads the row as written
                sql.run(cursor, w)
                w = Writes()
        return [results[i] for i in range(len(runs))]

    # -- operators --------------------------------------------------------------------------

    @_retrying
    def flush(self, key_hash, *, task_name, options, now=None):
        conn = connections[self.alias]
        sql = self._sql(conn)
        with self._step(conn, sql) as cursor:
            k, at = self._load(cursor, sql, key_hash, options, now)
            if k is None or k.store != "database":
                return None
            changed, msg = k.flush(at)
            if not changed:
                return None
            w = Writes()
            self._collect(w, sql, k, at)
            sql.run(cursor, w)
        return self._dispatch(key_hash, msg, task_name, k.key)

    @_retrying
    def cancel(self, key_hash, *, task_name, options, now=None):
        conn = connections[self.alias]
        sql = self._sql(conn)
        with self._step(conn, sql) as cursor:
            k, at = self._load(cursor, sql, key_hash, options, now)
            if k is None or k.store != "database":
                return 0
            dropped = k.cancel(at)
            w = Writes()
            self._collect(w, sql, k, at)
            sql.run(cursor, w)
        return dropped

    def due_keys(self, now=None, task_names=None):
        conn = connections[self.alias]
        sql = self._sql(conn)
        text = (
            f"SELECT task_name, key_hash FROM {q(KEY)} WHERE store = 'database'"
            " AND pending > 0 AND due_at <= %s"
        )
        with conn.cursor() as cursor:
            params: list[Any] = [sql.time(self._now_us(cursor, sql, now))]
            if task_names is not None:
                names = list(task_names)
                if not names:
                    return []
                if sql.pg:
                    text += " AND task_name = ANY(%s)"
                    params.append(names)
                else:
                    text += f" AND task_name IN ({sql.names(len(names))})"
                    params += names
            cursor.execute(text + " ORDER BY due_at", params)
            return [(t, h) for t, h in cursor.fetchall()]

    # -- reading ----------------------------------------------------------------------------

    def _held(self, key_hashes: Sequence[str]) -> Any:
        return DebounceKey.objects.using(self.alias).filter(
            key_hash__in=list(key_hashes), store="database"
        )

    def live_state(self, key_hash):
        row = (
            self._held([key_hash])
            .values_list(
                "pending",
                "flight_id",
                "triggers",
                "runs",
                "merged",
                "cancelled",
                "state",
                "scheduled_seq",
            )
            .first()
        )
        if row is None:
            return None
        names = ("pending", "flight_id", "triggers", "runs", "merged", "cancelled", "state")
        out: dict[str, Any] = dict(zip(names, row[:7], strict=True))
        out["seq"] = row[7]
        out["store_code"] = self.store
        return out

    def live_rows(self, key_hashes):
        if not key_hashes:
            return {}
        fields = (
            "state",
            "pending",
            "flight_id",
            "first_trigger_at",
            "last_trigger_at",
            "due_at",
            "running_until",
            "triggers",
            "runs",
            "merged",
            "cancelled",
            "last_run_at",
            "last_outcome",
        )
        return {
            row["key_hash"]: {f: row[f] for f in fields}
            for row in self._held(key_hashes).values("key_hash", *fields)
        }

    def pending_counts(self, key_hashes):
        if not key_hashes:
            return {}
        return dict(self._held(key_hashes).values_list("key_hash", "pending"))

    def index_stats(self, task_names=None):
        conn = connections[self.alias]
        sql = self._sql(conn)
        with conn.cursor() as cursor:
            at = self._now_us(cursor, sql, None)
            text = (
                f"SELECT task_name, COUNT(*), SUM(CASE WHEN due_at <= %s THEN 1 ELSE 0 END),"
                f" MIN(due_at) FROM {q(DebounceDue._meta.db_table)}"
            )
            params: list[Any] = [sql.time(at)]
            if task_names is not None:
                names = list(task_names)
                if not names:
                    return {}
                text += f" WHERE task_name IN ({sql.names(len(names))})"
                params += names
            cursor.execute(text + " GROUP BY task_name", params)
            rows = cursor.fetchall()
        out = {name: IndexStats(depth=0, due=0, oldest_due_age=0.0) for name in (task_names or [])}
        for name, depth, due, first in rows:
            first_us = to_us(first)
            age = max(at - first_us, 0) / US if first_us is not None and first_us <= at else 0.0
            out[name] = IndexStats(depth=int(depth), due=int(due or 0), oldest_due_age=age)
        return out
