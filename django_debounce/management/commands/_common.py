"""What ``debounce_status`` and ``debounce_purge`` share: the database of the debounce tables
(``--database``, default the router's) and the check of a ``--task`` name. Django does not
take this module for a command (its name starts with ``_``)."""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.core.management.base import CommandError
from django.db import DatabaseError, connections, router

from django_debounce import registry
from django_debounce.exceptions import UnknownTask
from django_debounce.models import DebounceKey

# Most keys ``debounce_status --limit`` lists: past it a table says nothing more (and a huge
# number overflowed the database's LIMIT, reported as missing tables).
MAX_LIMIT = 1_000_000


def limit_error(text: object) -> str:
    """What ``--limit`` says about a value that is not an integer from 1 to ``MAX_LIMIT``."""
    return (
        f"--limit must be a positive integer up to {MAX_LIMIT:,} (keys listed), e.g. "
        f"--limit 100; got {str(text)!r}."
    )


def limit(text: str) -> int:
    """The argparse ``type`` of ``--limit``: digits only (``1e20`` and ``100.0`` are not
    counts), from 1 to ``MAX_LIMIT``; else ``ArgumentTypeError`` (a ``CommandError`` under
    ``call_command``, exit status 2 from a shell) naming the accepted values."""
    stripped = text.strip()
    digits = stripped.isascii() and stripped.isdigit() and len(stripped) <= 12
    if not digits or not 1 <= int(stripped) <= MAX_LIMIT:
        raise argparse.ArgumentTypeError(limit_error(text))
    return int(stripped)


@contextmanager
def debounce_tables(options: dict[str, Any]) -> Iterator[str]:
    """``with debounce_tables(options) as alias:`` around a command's work on the debounce
    tables. ``alias`` is ``--database`` when given, else the one the project's router writes
    ``DebounceKey`` to; a ``--task`` is checked (``check_task``). Raises ``CommandError`` for
    an alias ``DATABASES`` does not have, and in place of a database error from the tables
    (most often: they are not there), naming the fix."""
    alias = options["database"]
    if alias is None:
        alias = str(router.db_for_write(DebounceKey))
    elif alias not in connections:
        raise CommandError(
            f"--database {alias!r} is not a database alias of this project; use one of: "
            f"{', '.join(connections)}."
        )
    try:
        if options["task"]:
            check_task(options["task"], alias)
        yield alias
    except DatabaseError as exc:
        raise CommandError(
            f"Could not read the debounce tables in database {alias!r}: {exc}".rstrip()
            + f"\nIf they are not there, run `manage.py migrate django_debounce --database "
            f"{alias}`, or give --database the alias your router puts them in "
            f"({router.db_for_write(DebounceKey)!r})."
        ) from None


def add_database_argument(parser: argparse.ArgumentParser, more: str = "") -> None:
    """The ``--database`` option (see ``debounce_tables``); ``more`` ends its help."""
    parser.add_argument(
        "--database",
        default=None,
        metavar="ALIAS",
        help="database alias of the debounce tables (default: the one the project's router "
        f"writes them to){more}",
    )


def check_task(task: str, alias: str) -> None:
    """Refuse a ``--task`` that is neither a registered debounced task here nor recorded in
    the debounce tables of database ``alias``, with the likely ones (``CommandError``)."""
    try:
        registry.get(task)
        return
    except UnknownTask:
        pass
    known = set(DebounceKey.objects.using(alias).values_list("task_name", flat=True).distinct())
    if task in known:
        return
    candidates = sorted(known | registry.names())
    close = difflib.get_close_matches(task, candidates, n=3)
    hint = f" Did you mean {' or '.join(map(repr, close))}?" if close else ""
    names = ", ".join(candidates[:20]) + (", ..." if len(candidates) > 20 else "")
    raise CommandError(
        f"--task {task!r} is neither a registered debounced task nor recorded in the "
        f"database.{hint} Give the task's Celery name, one of: {names or 'none yet'}."
    )
