"""The run table: which debounced run each pool process of a prefork worker executes, one
slot per process in an anonymous file inherited through the fork, each slot guarded by a
POSIX byte-range lock on its first byte (docs/design.md, "Dispatch at scale": the run table)."""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import signal
import struct
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

logger = logging.getLogger("django_debounce")

IDLE, RUNNING, STOPPING = 0, 1, 2
LABEL = 160  # bytes of the readable key a slot keeps (for the keeper's log line)
# pid, state, sequence, key hash (32 bytes), label length, label; padded to 256 bytes
_SLOT = struct.Struct(f"<qB7xq32sH{LABEL}s")
SIZE = 256
assert _SLOT.size <= SIZE
# A child whose run is being stopped waits this long for the kill, then exits by itself.
STOP_WAIT = 60.0


class RunTable:
    """The shared table of one worker: ``slots`` slots, one per pool process (keyed by pid)."""

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.owner = os.getpid()
        try:
            self.fd = os.memfd_create("django-debounce-runs", os.MFD_CLOEXEC)
        except (AttributeError, OSError):
            handle, path = tempfile.mkstemp(prefix="django-debounce-runs-")
            os.unlink(path)
            self.fd = handle
        os.ftruncate(self.fd, slots * SIZE)
        self._mine: tuple[int, int] | None = None  # (pid, slot) of this process

    # -- slots ------------------------------------------------------------------------------

    def _lock(self, slot: int, blocking: bool = True) -> bool:
        flags = fcntl.LOCK_EX if blocking else fcntl.LOCK_EX | fcntl.LOCK_NB
        try:
            fcntl.lockf(self.fd, flags, 1, slot * SIZE, os.SEEK_SET)
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EAGAIN) and not blocking:
                return False
            raise
        return True

    def _unlock(self, slot: int) -> None:
        fcntl.lockf(self.fd, fcntl.LOCK_UN, 1, slot * SIZE, os.SEEK_SET)

    @contextmanager
    def _locked(self, slot: int) -> Iterator[None]:
        """Hold a slot's lock (waiting for it) for the ``with`` block."""
        self._lock(slot)
        try:
            yield
        finally:
            self._unlock(slot)

    def _read(self, slot: int) -> tuple[int, int, int, bytes, str]:
        """``(pid, state, seq, key hash, label)`` of a slot."""
        raw = os.pread(self.fd, _SLOT.size, slot * SIZE)
        pid, state, seq, hashed, n, label = _SLOT.unpack(raw)
        return pid, state, seq, hashed, label[:n].decode("utf-8", "replace")

    def _write(
        self, slot: int, pid: int, state: int, seq: int = 0, hashed: bytes = b"", label: str = ""
    ) -> None:
        encoded = label.encode("utf-8", "replace")[:LABEL]
        os.pwrite(self.fd, _SLOT.pack(pid, state, seq, hashed, len(encoded), encoded), slot * SIZE)

    def snapshot(self) -> dict[int, tuple[int, int, int, bytes]]:
        """``{pid: (slot, state, seq, key hash)}`` of every slot in use, in one read and
        without a lock. A slot read while its process writes it may mix its old and new
        values, but it names a run only once that run was claimed: seeing a run there is
        proof that it had been claimed by then, never that it still runs."""
        raw = os.pread(self.fd, self.slots * SIZE, 0)
        out = {}
        for slot in range(self.slots):
            pid, state, seq, hashed, _n, _label = _SLOT.unpack_from(raw, slot * SIZE)
            if pid:
                out[pid] = (slot, state, seq, hashed)
        return out

    # -- the pool process's side -----------------------------------------------------------

    def register(self) -> int | None:
        """Give this process a slot of its own (at its start, ``worker_process_init``): a
        slot left by a dead process with the same pid is taken over and cleared, else a free
        one or one of a process that is gone. ``None`` when the table is full."""
        pid = os.getpid()
        if self._mine is not None and self._mine[0] == pid:
            return self._mine[1]
        for candidate in (lambda p: p == pid, lambda p: p == 0, _gone):
            for slot in range(self.slots):
                if not candidate(self._read(slot)[0]):
                    continue
                with self._locked(slot):
                    taken = candidate(self._read(slot)[0])  # again, under the lock
                    if taken:
                        self._write(slot, pid, IDLE)
                if taken:
                    self._mine = (pid, slot)
                    return slot
        logger.warning(
            "django_debounce: the run table of this worker is full: the lease keeper "
            "will not stop the runs of pool process %d",
            pid,
        )
        return None

    def started(self, key_hash: str, seq: int, label: str) -> bool:
        """Record that this process executes the run claimed by message ``seq`` of
        ``key_hash`` (its claim succeeded). ``False`` when this process has no slot."""
        slot = self.register()
        if slot is None:
            return False
        with self._locked(slot):
            self._write(slot, os.getpid(), RUNNING, seq, bytes.fromhex(key_hash), label)
        return True

    def ended(self) -> None:
        """The body of this process's run ended: clear its slot, unless the keeper is stopping
        it, in which case wait to be killed and never take another task."""
        slot = self.register()
        if slot is None:
            return
        with self._locked(slot):
            stopping = self._read(slot)[1] == STOPPING
            if not stopping:
                self._write(slot, os.getpid(), IDLE)
        if stopping:
            _await_the_kill()

    # -- the keeper's side -----------------------------------------------------------------

    @staticmethod
    def claimed(
        snapshot: dict[int, tuple[int, int, int, bytes]], pid: int, key_hash: str, seq: int
    ) -> bool:
        """Whether process ``pid`` said, in ``snapshot``, that it executes that run (so the run
        had been claimed when the snapshot was taken)."""
        got = snapshot.get(pid)
        return got is not None and _executes(*got[1:], key_hash, seq)

    def _lock_within(self, slot: int, seconds: float) -> bool:
        """Take a slot's lock, waiting at most ``seconds`` (a pool process holds it for a few
        microseconds, unless it is itself stopped)."""
        deadline = time.monotonic() + seconds
        while not self._lock(slot, blocking=False):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        return True

    def stop(self, pid: int, key_hash: str, seq: int) -> str | None:
        """Kill process ``pid`` if, checked now under its slot's lock, it still executes the
        run ``(key_hash, seq)``; its slot is marked stopping first, so that a body ending
        meanwhile waits for the kill. Returns the run's readable key (as the child wrote it)
        when the process was killed, ``None`` when it was left alone (it runs something else,
        or nothing, or could not be locked in time)."""
        got = self.snapshot().get(pid)  # checked again under the slot's lock
        if got is None:
            return None
        slot = got[0]
        pidfd = _pidfd(pid)  # the process now: a pid reused later cannot be signalled
        try:
            if not self._lock_within(slot, 1.0):
                return None  # held by a stopped process: the next tick tries again
            try:
                got_pid, state, got_seq, hashed, label = self._read(slot)
                if got_pid != pid or not _executes(state, got_seq, hashed, key_hash, seq):
                    return None
                self._write(slot, pid, STOPPING, seq, hashed, label)
            finally:
                self._unlock(slot)
            _kill(pid, pidfd)
            return label
        finally:
            if pidfd is not None:
                os.close(pidfd)


def _executes(state: int, got_seq: int, hashed: bytes, key_hash: str, seq: int) -> bool:
    """Whether a slot's ``state``, sequence and key hash say it executes run ``(key_hash, seq)``."""
    return state in (RUNNING, STOPPING) and got_seq == seq and hashed == bytes.fromhex(key_hash)


def _gone(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _kill(pid: int, pidfd: int | None) -> None:
    try:
        if pidfd is not None:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # gone already


def _await_the_kill() -> None:
    """The keeper decided to stop this process's run and is about to kill it: never go on to
    another task. Exit after ``STOP_WAIT`` seconds, or when the main process is gone."""
    parent = os.getppid()
    logger.warning(
        "django_debounce: pool process %d: the lease keeper is stopping its run; waiting for it",
        os.getpid(),
    )
    until = time.monotonic() + STOP_WAIT
    while time.monotonic() < until and os.getppid() == parent:
        time.sleep(0.05)
    os._exit(1)


# The table of this worker (created in its main process before the pool forks; inherited by
# every pool process). ``None`` outside a prefork worker.
TABLE: RunTable | None = None


def install(slots: int) -> RunTable:
    """Create this worker's table (in its main process, before the pool starts) and have every
    pool process register at its start."""
    global TABLE
    from celery.signals import worker_process_init

    if TABLE is None or TABLE.owner != os.getpid():
        TABLE = RunTable(slots)
    worker_process_init.connect(_register, weak=False, dispatch_uid="django_debounce.runtable")
    return TABLE


def _register(**kwargs: Any) -> None:
    if TABLE is not None:
        TABLE.register()


@contextmanager
def executing(key_hash: str, seq: int | None, key: str) -> Iterator[None]:
    """``with executing(key_hash, seq, key):`` around a claimed run's body in a pool process:
    the run is in the table while the body runs. Does nothing outside a prefork pool process
    (no table, or the main process) and for runs claimed without a message (``seq`` None)."""
    table = TABLE
    if table is None or seq is None or os.getpid() == table.owner:
        yield
        return
    try:
        recorded = table.started(key_hash, seq, key)
    except (OSError, ValueError):
        logger.exception("django_debounce: could not record a run in the run table")
        recorded = False
    try:
        yield
    finally:
        if recorded:
            try:
                table.ended()
            except OSError:
                logger.exception("django_debounce: could not clear a run from the run table")
