"""Fixtures (issue 23 item 4): a debounced ``post_save`` receiver leaves raw saves
(``loaddata``) out unless it has ``raw=True``; then a run is handed ``raw=True`` only if every
trigger it covers was raw."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import transaction
from django.utils import timezone

from django_debounce.testing import run_due
from tests.support.private_tasks import private_receiver
from tests.testapp.models import OtherItem
from tests.testapp.tasks import other_saved

pytestmark = pytest.mark.django_db(transaction=True)


def fixture(tmp_path: Path, *pks: int) -> str:
    path = tmp_path / "rows.json"
    rows = [{"model": "testapp.otheritem", "pk": pk, "fields": {"value": pk}} for pk in pks]
    path.write_text(json.dumps(rows))
    return str(path)


def run_all() -> None:
    run_due(timezone.now() + timedelta(hours=2))


def test_fixtures_trigger_nothing_by_default(store, tmp_path):
    with private_receiver("raw_saves.default", OtherItem, wait=3600) as task:
        call_command("loaddata", fixture(tmp_path, 1, 2), verbosity=0)
        assert OtherItem.objects.count() == 2
        for pk in (1, 2):
            assert task.status(OtherItem, pk) is None
            assert other_saved.status(OtherItem, pk) is None
        OtherItem.objects.get(pk=1).save()
        assert task.status(OtherItem, 1).pending == 1


def test_raw_true_debounces_fixtures_and_hands_raw_true_when_every_trigger_was(
    store, eager, tmp_path
):
    with private_receiver("raw_saves.all_raw", OtherItem, wait=3600, raw=True) as task:
        path = fixture(tmp_path, 1)
        call_command("loaddata", path, verbosity=0)
        call_command("loaddata", path, verbosity=0)
        assert task.status(OtherItem, 1).pending == 2
        run_all()
        assert [(c["pk"], c["raw"]) for c in task.calls] == [(1, True)]


@pytest.mark.parametrize("order", ["real_then_fixture", "fixture_then_real", "one_commit"])
def test_a_run_that_covers_a_real_save_is_not_raw(store, eager, tmp_path, order):
    with private_receiver("raw_saves.mixed", OtherItem, wait=3600, raw=True) as task:
        path = fixture(tmp_path, 1)
        if order == "fixture_then_real":
            call_command("loaddata", path, verbosity=0)
            OtherItem.objects.get(pk=1).save()
        elif order == "real_then_fixture":
            OtherItem.objects.create(pk=1, value=0)
            call_command("loaddata", path, verbosity=0)
        else:
            with transaction.atomic():
                OtherItem.objects.create(pk=1, value=0)
                call_command("loaddata", path, verbosity=0)
        assert task.status(OtherItem, 1).pending == 2
        run_all()
        assert [(c["pk"], c["raw"]) for c in task.calls] == [(1, False)]


def test_raw_is_checked_as_a_receiver_option():
    with pytest.raises(TypeError, match="raw"):
        with private_receiver("raw_saves.bad", OtherItem, rwa=True):
            pass
