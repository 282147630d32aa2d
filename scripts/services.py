#!/usr/bin/env python3
"""Start and stop throwaway Redis, Redis Cluster and PostgreSQL 15 servers for the test suite.

    python3 scripts/services.py up --dir DIR    # start them all, write DIR/env.sh
    python3 scripts/services.py down --dir DIR  # stop both, remove DIR
    python3 scripts/services.py browser         # make sure Debian's chromium + chromedriver exist

Stdlib only: it runs under the system python3 before any virtualenv exists.
Every server listens on 127.0.0.1 only, on free ports, and keeps all its
state under DIR. DEBOUNCE_TEST_PORTS=LOW-HIGH (e.g. 20000-20999) makes every port (Redis,
PostgreSQL, the cluster nodes and their bus ports) come from that range, for a machine whose
users share out port ranges. The Redis Cluster has three masters and no replicas (made with
redis-cli --cluster create); a cluster that cannot be made fails `up`.
Missing Debian packages are installed with apt-get.
"""

import argparse
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

PG_BIN = "/usr/lib/postgresql/15/bin"
POLICY_RC_D = "/usr/sbin/policy-rc.d"
IS_ROOT = os.geteuid() == 0
PG_SETTINGS = {
    "listen_addresses": "'127.0.0.1'",
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_connections": "200",
}


class ServiceError(Exception):
    """A step failed; the message says which and why."""


def log(msg):
    """Print a progress message to stderr (stdout is kept for env lines)."""
    print(f"services: {msg}", file=sys.stderr, flush=True)


def run(cmd, as_postgres=False, check=True, **kw):
    """Run cmd (as the postgres user when root and as_postgres), capturing output."""
    if as_postgres and IS_ROOT:
        cmd = ["runuser", "-u", "postgres", "--"] + cmd
    proc = subprocess.run(cmd, cwd="/", text=True, capture_output=True, **kw)
    if check and proc.returncode != 0:
        raise ServiceError(
            f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}".rstrip()
        )
    return proc


def ensure_packages():
    """Install redis-server and postgresql-15 with apt-get if either is missing."""
    missing = []
    if not shutil.which("redis-server"):
        missing.append("redis-server")
    if not os.access(os.path.join(PG_BIN, "initdb"), os.X_OK):
        missing.append("postgresql-15")
    apt_install(missing)
    if not shutil.which("redis-server") or not os.path.exists(os.path.join(PG_BIN, "initdb")):
        raise ServiceError("packages installed but binaries still not found")


BROWSER = {"chromium": "/usr/bin/chromium", "chromium-driver": "/usr/bin/chromedriver"}


def ensure_browser():
    """Install Debian's chromium and chromium-driver (for the browser test) if missing."""
    apt_install([pkg for pkg, path in BROWSER.items() if not os.access(path, os.X_OK)])
    missing = [path for path in BROWSER.values() if not os.access(path, os.X_OK)]
    if missing:
        raise ServiceError(f"packages installed but {', '.join(missing)} still not found")


def apt_install(missing):
    """apt-get install the Debian packages in missing (nothing when it is empty)."""
    if not missing:
        return
    if not IS_ROOT:
        raise ServiceError(f"missing {', '.join(missing)} and not root to apt-get install")
    log(f"installing {' '.join(missing)} with apt-get ...")
    started = time.monotonic()
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    # Keep the packages' own init scripts from starting system-wide daemons.
    own_policy = not os.path.exists(POLICY_RC_D)
    if own_policy:
        with open(POLICY_RC_D, "w") as fh:
            fh.write("#!/bin/sh\nexit 101\n")
        os.chmod(POLICY_RC_D, 0o755)
    try:
        for cmd in (["apt-get", "update"], ["apt-get", "install", "-y"] + missing):
            if subprocess.run(cmd, env=env, stdout=sys.stderr).returncode != 0:
                raise ServiceError(f"{' '.join(cmd)} failed")
    finally:
        if own_policy:
            os.remove(POLICY_RC_D)
    log(f"apt-get finished in {time.monotonic() - started:.0f}s")


def free_port():
    """Return a TCP port on 127.0.0.1 that is free right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


CLUSTER_NODES = 3
PORTS_ENV = "DEBOUNCE_TEST_PORTS"
# Redis, PostgreSQL, and each cluster node with its bus port.
PORTS_NEEDED = 2 + 2 * CLUSTER_NODES


def port_range(value, needed=PORTS_NEEDED):
    """The (low, high) range of DEBOUNCE_TEST_PORTS=value ("20000-20999", both ends included),
    or None when value is unset or blank. Raises ServiceError naming the accepted form when
    value is malformed, outside 1024-65535, or holds fewer than needed ports."""
    if value is None or not value.strip():
        return None
    match = re.fullmatch(r"\s*(\d{1,5})\s*-\s*(\d{1,5})\s*", value)
    form = f"write {PORTS_ENV}=LOW-HIGH, e.g. {PORTS_ENV}=20000-20999 (ports 1024-65535)"
    if not match:
        raise ServiceError(f"{PORTS_ENV}={value!r} is not a port range: {form}.")
    low, high = int(match.group(1)), int(match.group(2))
    if not 1024 <= low <= high <= 65535:
        raise ServiceError(
            f"{PORTS_ENV}={value!r}: the range must run upwards within 1024-65535: {form}."
        )
    if high - low + 1 < needed:
        raise ServiceError(
            f"{PORTS_ENV}={value!r} holds {high - low + 1} ports; the services need at least "
            f"{needed} (Redis, PostgreSQL, {CLUSTER_NODES} Redis Cluster nodes and their bus "
            "ports): give a wider range."
        )
    return low, high


def port_is_free(port):
    """Whether a TCP port on 127.0.0.1 can be bound right now."""
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class Ports:
    """Hands out free ports, each once: any free port, or with DEBOUNCE_TEST_PORTS one from its
    range (in random order, so two runs in one range rarely race for the same port)."""

    def __init__(self, value=None):
        self.range = port_range(value)
        self.taken = set()
        self._left = None
        if self.range is not None:
            self._left = list(range(self.range[0], self.range[1] + 1))
            random.shuffle(self._left)

    def pick(self):
        """A free port not handed out before; ServiceError when the range has none left."""
        if self._left is None:
            for _ in range(200):
                port = free_port()
                if port not in self.taken:
                    self.taken.add(port)
                    return port
            raise ServiceError("no free port found")
        while self._left:
            port = self._left.pop()
            if port not in self.taken and port_is_free(port):
                self.taken.add(port)
                return port
        low, high = self.range
        raise ServiceError(
            f"{PORTS_ENV}={low}-{high}: too few free ports in the range ({len(self.taken)} "
            f"found, {PORTS_NEEDED} needed; the others are in use): give a wider or another range."
        )

    def cluster_node(self):
        """(port, bus port) for a Redis Cluster node: with a range both come from it;
        without, the bus port is Redis's default, port + 10000, which must be free too."""
        if self.range is not None:
            return self.pick(), self.pick()
        for _ in range(200):
            port = free_port()
            bus = port + 10000
            if port in self.taken or bus > 65535 or bus in self.taken or not port_is_free(bus):
                continue
            self.taken.update((port, bus))
            return port, bus
        raise ServiceError("no free port pair for a Redis Cluster node")


def redis_command(port, command, timeout=1.0):
    """Send one inline command to Redis on port; return the reply line or None."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(command.encode() + b"\r\n")
            return sock.recv(64).decode(errors="replace").strip()
    except OSError:
        return None


def wait_for(what, check, deadline=60.0):
    """Poll check() every 0.1s until it is truthy or the deadline passes."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if check():
            return
        time.sleep(0.1)
    raise ServiceError(f"{what} did not answer within {deadline:.0f}s")


def tail(path, lines=20):
    """Return the last lines of a log file, for error messages."""
    try:
        with open(path, errors="replace") as fh:
            return "".join(fh.readlines()[-lines:])
    except OSError:
        return "(no log)"


def start_redis(d, port):
    """Start a non-persistent, daemonized redis-server on 127.0.0.1:port."""
    run(
        [
            "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "yes",
            "--dir",
            d,
            "--pidfile",
            os.path.join(d, "redis.pid"),
            "--logfile",
            os.path.join(d, "redis.log"),
        ]
    )
    try:
        wait_for("redis", lambda: redis_command(port, "PING") == "+PONG", 30)
    except ServiceError as exc:
        raise ServiceError(f"{exc}\n{tail(os.path.join(d, 'redis.log'))}") from None


def start_cluster(d, ports, bus_ports):
    """Start one cluster-enabled redis-server per port, its bus on the bus port of the same
    index (non-persistent, daemonized, each in d/cluster-<port>), join them as a 3-master
    cluster, and wait until every node says cluster_state:ok."""
    for port, bus in zip(ports, bus_ports, strict=True):
        node = os.path.join(d, f"cluster-{port}")
        os.makedirs(node, exist_ok=True)
        run(
            [
                "redis-server",
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "yes",
                "--dir",
                node,
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "5000",
                *(["--cluster-port", str(bus)] if bus != port + 10000 else []),
                "--pidfile",
                os.path.join(node, "redis.pid"),
                "--logfile",
                os.path.join(node, "redis.log"),
            ]
        )
        try:
            wait_for(
                f"redis cluster node {port}",
                lambda port=port: redis_command(port, "PING") == "+PONG",
                30,
            )
        except ServiceError as exc:
            raise ServiceError(f"{exc}\n{tail(os.path.join(node, 'redis.log'))}") from None
    run(
        [
            "redis-cli",
            "--cluster",
            "create",
            *[f"127.0.0.1:{p}" for p in ports],
            "--cluster-replicas",
            "0",
            "--cluster-yes",
        ]
    )

    def ok():
        return all("cluster_state:ok" in cluster_info(p) for p in ports)

    wait_for("the redis cluster (cluster_state:ok)", ok, 60)


def cluster_info(port):
    """The text of CLUSTER INFO from the node on port ('' when it does not answer)."""
    proc = run(["redis-cli", "-p", str(port), "cluster", "info"], check=False, timeout=5)
    return proc.stdout if proc.returncode == 0 else ""


def start_postgres(d, port):
    """initdb a trust-auth cluster in d/pg, start it on 127.0.0.1:port, create 'debounce'."""
    data, sock_dir, logfile = (os.path.join(d, n) for n in ("pg", "pgsock", "pg.log"))
    for path in (data, sock_dir):
        os.makedirs(path, mode=0o700)
    open(logfile, "a").close()
    if IS_ROOT:
        os.chmod(d, 0o755)  # postgres must traverse DIR (mktemp -d makes it 0700)
        for path in (data, sock_dir, logfile):
            os.chown(path, *pg_ids())
        if run(["test", "-w", sock_dir], as_postgres=True, check=False).returncode:
            raise ServiceError(f"user postgres cannot reach {d}; choose a DIR under /tmp")
    base = [f"{PG_BIN}/initdb", "-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8"]
    if run(base + ["--locale=C.UTF-8"], as_postgres=True, check=False).returncode:
        shutil.rmtree(data, ignore_errors=True)
        os.makedirs(data, mode=0o700)
        if IS_ROOT:
            os.chown(data, *pg_ids())
        run(base + ["--locale=C"], as_postgres=True)
    settings = dict(PG_SETTINGS, port=str(port), unix_socket_directories=f"'{sock_dir}'")
    with open(os.path.join(data, "postgresql.conf"), "a") as fh:
        fh.write("\n# services.py: throwaway test server\n")
        fh.writelines(f"{k} = {v}\n" for k, v in settings.items())
    run([f"{PG_BIN}/pg_ctl", "-D", data, "-l", logfile, "-W", "start"], as_postgres=True)
    ready = [f"{PG_BIN}/pg_isready", "-q", "-h", "127.0.0.1", "-p", str(port), "-U", "postgres"]
    try:
        wait_for("postgres", lambda: run(ready, check=False).returncode == 0, 60)
    except ServiceError as exc:
        raise ServiceError(f"{exc}\n{tail(logfile)}") from None
    run(
        [
            f"{PG_BIN}/psql",
            "-X",
            "-q",
            "-h",
            "127.0.0.1",
            "-p",
            str(port),
            "-U",
            "postgres",
            "-d",
            "postgres",
            "-v",
            "ON_ERROR_STOP=1",
            "-c",
            "CREATE DATABASE debounce",
        ]
    )


def pg_ids():
    """Return (uid, gid) of the postgres OS user."""
    import pwd

    try:
        entry = pwd.getpwnam("postgres")
    except KeyError:
        raise ServiceError("no 'postgres' OS user (is postgresql-15 installed?)") from None
    return entry.pw_uid, entry.pw_gid


def stop_all(d):
    """Stop whatever of Redis and PostgreSQL is running from d; tolerate absences."""
    try:
        with open(os.path.join(d, "state.json")) as fh:
            state = json.load(fh)
    except (OSError, ValueError):
        state = {}
    pidfile = os.path.join(d, "redis.pid")
    try:
        with open(pidfile) as fh:
            pid = int(fh.read().strip())
    except (OSError, ValueError):
        pid = None
    for port in state.get("cluster_ports", []):
        stop_redis(os.path.join(d, f"cluster-{port}", "redis.pid"), port)
    if state.get("redis_port"):
        redis_command(state["redis_port"], "SHUTDOWN NOSAVE")
    if pid:
        try:
            wait_for("redis shutdown", lambda: not pid_alive(pid), 5)
        except ServiceError:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    data = os.path.join(d, "pg")
    if os.path.exists(os.path.join(data, "postmaster.pid")):
        proc = run(
            [f"{PG_BIN}/pg_ctl", "-D", data, "-m", "immediate", "-w", "stop"],
            as_postgres=True,
            check=False,
        )
        if proc.returncode:
            log(f"pg_ctl stop: {proc.stderr.strip() or proc.stdout.strip()}")


def stop_redis(pidfile, port):
    """SHUTDOWN NOSAVE the redis-server on port; SIGKILL its pid if it lingers."""
    try:
        with open(pidfile) as fh:
            pid = int(fh.read().strip())
    except (OSError, ValueError):
        pid = None
    redis_command(port, "SHUTDOWN NOSAVE")
    if pid:
        try:
            wait_for("redis shutdown", lambda: not pid_alive(pid), 5)
        except ServiceError:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def pid_alive(pid):
    """Return True if a process with this pid exists (and is not a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ")[-1][:1] != "Z"
    except OSError:
        return False


def up(d):
    """Start the services under d and print/write the env exports."""
    d = os.path.abspath(d)
    if os.path.exists(os.path.join(d, "state.json")):
        log(f"{d} already holds services; stopping them first")
        down(d)
    os.makedirs(d, exist_ok=True)
    try:
        ports = Ports(os.environ.get(PORTS_ENV))  # a malformed range fails before apt-get
        ensure_packages()
        redis_port = ports.pick()
        pg_port = ports.pick()
        nodes = [ports.cluster_node() for _ in range(CLUSTER_NODES)]
        cluster_ports = [port for port, _bus in nodes]
        with open(os.path.join(d, "state.json"), "w") as fh:
            json.dump(
                {"redis_port": redis_port, "pg_port": pg_port, "cluster_ports": cluster_ports}, fh
            )
        start_redis(d, redis_port)
        start_cluster(d, cluster_ports, [bus for _port, bus in nodes])
        start_postgres(d, pg_port)
    except (ServiceError, OSError) as exc:
        print(f"services.py up: ERROR: {exc}", file=sys.stderr)
        stop_all(d)
        return 1
    lines = (
        f"export DEBOUNCE_TEST_REDIS_URL=redis://127.0.0.1:{redis_port}/0\n"
        f"export DEBOUNCE_TEST_POSTGRES_URL=postgres://postgres@127.0.0.1:{pg_port}/debounce\n"
        "export DEBOUNCE_TEST_REDIS_CLUSTER="
        + ",".join(f"127.0.0.1:{p}" for p in cluster_ports)
        + "\n"
    )
    with open(os.path.join(d, "env.sh"), "w") as fh:
        fh.write(lines)
    sys.stdout.write(lines)
    return 0


def down(d):
    """Stop the services started under d and remove d."""
    d = os.path.abspath(d)
    if os.path.isdir(d):
        stop_all(d)
        shutil.rmtree(d, ignore_errors=True)
    return 0


def main():
    """Parse arguments and dispatch to up or down."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["up", "down", "browser"])
    parser.add_argument("--dir", help="state directory (removed by down)")
    args = parser.parse_args()
    if args.action == "browser":
        try:
            ensure_browser()
        except (ServiceError, OSError) as exc:
            print(f"services.py browser: ERROR: {exc}", file=sys.stderr)
            return 1
        return 0
    if not args.dir:
        parser.error("--dir is required for up and down")
    return up(args.dir) if args.action == "up" else down(args.dir)


if __name__ == "__main__":
    sys.exit(main())
