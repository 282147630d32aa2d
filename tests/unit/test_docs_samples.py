"""Every ```python sample of README.md and the manual (docs/**/*.md) runs as written (issue 14).

One subprocess (``tests/unit/docs_samples_runner.py``) runs them all, each in a fresh namespace, on
the example project (``catalogue`` is ``example_project.catalogue``) with a fresh SQLite file,
kombu's in-memory broker and Celery in eager mode, and checks what each shows (a defined task
is a registered ``DebouncedTask``, a trigger returns a counted ``TriggerResult``, a receiver
runs when its model is saved, ...; see the runner's docstring). No server is needed.

The list of samples is found here independently of the runner (any fence whose info string
names Python), so a block the runner would not recognise fails instead of being left out.
A block that cannot run is preceded by ``<!-- sample: not run (reason) -->`` and is skipped
with its reason.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]  # the repository
RUNNER = Path(__file__).with_name("docs_samples_runner.py")
FENCE = re.compile(r"^\s*(`{3,}|~{3,})(.*)$")


def python_blocks() -> list[str]:
    """``path:line`` of every fenced block of README.md and docs/**/*.md whose info string
    mentions Python (``python``, ``py``, ``pycon``, ``{code-block} python``, ...)."""
    docs = sorted(p for p in (ROOT / "docs").rglob("*.md") if "_build" not in p.parts)
    found = []
    for path in [ROOT / "README.md", *docs]:
        fence = None
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            match = FENCE.match(line)
            if not match:
                continue
            if fence is None:
                fence = match[1]
                if "py" in match[2].lower():
                    found.append(f"{path.relative_to(ROOT)}:{number}")
            elif match[1][0] == fence[0] and len(match[1]) >= len(fence) and not match[2].strip():
                fence = None
    return found


BLOCKS = python_blocks()


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("docs-samples")
    out = tmp / "results.json"
    proc = subprocess.run(
        [sys.executable, str(RUNNER), "--json", str(out), "--tmp", str(tmp)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if not out.exists():
        pytest.fail(
            f"the sample runner exited with {proc.returncode} and wrote no results:\n"
            f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
        )
    return {sample["id"]: sample for sample in json.loads(out.read_text())["samples"]}


def test_the_runner_runs_every_block(results: dict[str, dict[str, Any]]) -> None:
    assert BLOCKS, "no python block found in README.md or docs/"
    assert sorted(results) == sorted(BLOCKS)


@pytest.mark.parametrize("block", BLOCKS)
def test_sample(block: str, results: dict[str, dict[str, Any]]) -> None:
    sample = results.get(block)
    assert sample is not None, f"{block}: not run (see test_the_runner_runs_every_block)"
    if sample.get("skipped"):
        pytest.skip(f"{block}: marked not run ({sample['skipped']})")
    output = f"\nits output:\n{sample['output']}" if sample.get("output") else ""
    assert sample["ok"], f"{block} failed:\n{sample['error']}{output}"
    # every sample shows something the runner checked (a setting, a task, a result, ...)
    assert sample["checks"], f"{block} ran, but nothing it shows was checked"
