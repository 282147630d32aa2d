"""README.md and docs/getting-started.md state the same minimum Python, Django and Celery
versions as pyproject.toml, the one source of them (a new user follows the docs literally)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = ["README.md", "docs/getting-started.md"]


def minimums() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    out = {"Python": re.fullmatch(r">=\s*([\d.]+)", project["requires-python"])[1]}
    for requirement in project["dependencies"]:
        match = re.fullmatch(r"(?i)(django|celery)\s*>=\s*([\d.]+)", requirement)
        if match:
            out[{"django": "Django", "celery": "Celery"}[match[1].lower()]] = match[2]
    return out


def test_pyproject_names_a_minimum_of_each():
    assert set(minimums()) == {"Python", "Django", "Celery"}


@pytest.mark.parametrize("page", PAGES)
@pytest.mark.parametrize("name", ["Python", "Django", "Celery"])
def test_a_page_states_pyprojects_minimum(page, name):
    text = " ".join((ROOT / page).read_text(encoding="utf-8").split())
    # "Django 5.2+" or "Django 5.2 or later" (a version the suite runs on, "Django 6.1", is
    # not a minimum)
    stated = re.findall(rf"\b{name} (\d+(?:\.\d+)+)(?:\+| or later)", text)
    assert stated, f"{page} states no minimum {name} version"
    assert set(stated) == {minimums()[name]}, f"{page}: {name} {stated} vs pyproject.toml"
