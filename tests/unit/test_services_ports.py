"""``scripts/services.py``: ``DEBOUNCE_TEST_PORTS=LOW-HIGH`` names the port range the test
servers take their ports from (Redis, PostgreSQL, the cluster nodes and their bus ports); a
malformed or too small range is refused with a message naming the accepted form."""

from __future__ import annotations

import importlib.util
import socket

import pytest

from tests.support.helpers import ROOT


def _services():
    spec = importlib.util.spec_from_file_location("services", ROOT / "scripts" / "services.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


services = _services()


@pytest.mark.parametrize(
    "value, expected",
    [
        (None, None),
        ("", None),
        ("  ", None),
        ("20000-20999", (20000, 20999)),
        (" 20000 - 20007 ", (20000, 20007)),
        ("65528-65535", (65528, 65535)),
    ],
)
def test_a_range_is_parsed(value, expected):
    assert services.port_range(value) == expected


@pytest.mark.parametrize(
    "value, text",
    [
        ("20000", "is not a port range: write DEBOUNCE_TEST_PORTS=LOW-HIGH, e.g."),
        ("20000:20999", "is not a port range"),
        ("a-b", "is not a port range"),
        ("20000-", "is not a port range"),
        ("-20000-20999", "is not a port range"),
        ("20999-20000", "must run upwards within 1024-65535"),
        ("80-1000", "must run upwards within 1024-65535"),
        ("65000-70000", "must run upwards within 1024-65535"),
        ("20000-20006", "holds 7 ports; the services need at least 8"),
        ("20000-20000", "holds 1 ports"),
    ],
)
def test_a_malformed_or_too_small_range_is_refused(value, text):
    with pytest.raises(services.ServiceError, match=text):
        services.port_range(value)


def test_every_port_comes_from_the_range_once():
    low = services.free_port()
    low = min(low, 65535 - 199)
    ports = services.Ports(f"{low}-{low + 199}")
    picked = [ports.pick() for _ in range(2)]
    for _ in range(services.CLUSTER_NODES):
        picked.extend(ports.cluster_node())
    assert len(picked) == services.PORTS_NEEDED == len(set(picked))
    assert all(low <= port <= low + 199 for port in picked)


def test_a_port_in_use_is_skipped_and_an_exhausted_range_is_a_clear_error():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        low = min(port, 65535 - 7)
        ports = services.Ports(f"{low}-{low + 7}")
        picked = []
        with pytest.raises(services.ServiceError, match="too few free ports in the range"):
            for _ in range(8):
                picked.append(ports.pick())
        assert port not in picked and len(picked) <= 7
