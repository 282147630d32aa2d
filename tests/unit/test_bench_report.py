"""The comparison benchmark's analysis (``bench/report.py``): how overlapping runs, the final
state and the trigger-to-start delay are counted from trigger times and run records."""

from __future__ import annotations

from types import SimpleNamespace

from bench.report import analyse


def _info(times: dict[int, list[float]], final: dict[int, int]) -> dict:
    stream = SimpleNamespace(times=times, final=final, count=sum(len(t) for t in times.values()))
    return {"stream": stream, "published": 3, "broker_lpush": 3}


def run(pk: int, version: int, start: float, end: float) -> list:
    return ["x", pk, version, start, end, 1, None]


def test_overlapping_runs_of_one_key_are_counted_once_each() -> None:
    runs = [run(1, 1, 10.0, 12.0), run(1, 2, 11.0, 13.0), run(1, 3, 14.0, 15.0)]
    out = analyse("a", "x", _info({1: [9.0, 9.5, 10.5]}, {1: 3}), runs)
    assert out["overlapping_runs"] == 2
    assert out["max_concurrent_runs_per_key"] == 2
    assert out["final_applied"] is True
    assert out["last_trigger_to_end_s"] == 4.5


def test_runs_of_different_keys_never_overlap_each_other() -> None:
    runs = [run(1, 1, 10.0, 12.0), run(2, 1, 10.0, 12.0)]
    out = analyse("a", "x", _info({1: [9.0], 2: [9.0]}, {1: 1, 2: 1}), runs)
    assert out["overlapping_runs"] == 0


def test_final_state_needs_a_run_after_the_last_trigger_that_saw_the_last_version() -> None:
    # The last run started after the last trigger but read the row before it was written.
    stale = analyse("c", "x", _info({1: [1.0, 5.0]}, {1: 2}), [run(1, 1, 6.0, 7.0)])
    assert stale["final_applied"] is False
    # The last run saw the last version but started before the last trigger was made.
    early = analyse("c", "x", _info({1: [1.0, 5.0]}, {1: 2}), [run(1, 2, 4.0, 7.0)])
    assert early["final_applied"] is False
    ok = analyse("c", "x", _info({1: [1.0, 5.0]}, {1: 2}), [run(1, 2, 5.5, 7.0)])
    assert ok["final_applied"] is True


def test_delay_is_from_the_last_trigger_before_each_run_start() -> None:
    runs = [run(1, 1, 2.0, 2.1), run(1, 2, 6.0, 6.1)]
    out = analyse("a", "x", _info({1: [1.0, 1.5, 5.0]}, {1: 2}), runs)
    assert out["delay_ms_median"] == 750.0  # median of 500 ms and 1000 ms
