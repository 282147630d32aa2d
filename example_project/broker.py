"""kombu's ``filesystem://`` transport with atomic message files, for the server-less default.

kombu's filesystem transport writes a message by opening ``<name>.msg`` and then writing it,
while a consumer lists the folder and reads whatever ``*.msg`` it finds without taking the
writer's lock. A consumer that polls between the two steps reads an empty or partial file and
fails with ``JSONDecodeError`` (celery/kombu#1551). With a worker polling every 10 ms and
several processes publishing, that window is hit now and then.

This subclass writes each message to a hidden temporary file in the same folder and renames it
into place (``os.replace`` is atomic on POSIX), so a consumer only ever sees complete messages.
Everything else is kombu's. Settings select it with::

    CELERY_BROKER_URL = "filesystem://"
    CELERY_BROKER_TRANSPORT = "example_project.broker:FilesystemTransport"
"""

from __future__ import annotations

import os
import uuid
from time import monotonic

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps


class FilesystemChannel(filesystem.Channel):
    """A filesystem channel whose ``_put`` is write-then-rename."""

    def _put(self, queue, payload, **kwargs):
        """Put ``payload`` onto ``queue`` as one complete file (same name scheme as kombu)."""
        name = f"{int(round(monotonic() * 1000))}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        # A leading dot: kombu's reader takes ``name.partition('.')[2]`` as the queue part,
        # which for ".tmp-..." never equals "<queue>.msg", so half-written files are skipped.
        tmp = os.path.join(self.data_folder_out, f".tmp-{uuid.uuid4()}")
        try:
            with open(tmp, "wb", buffering=0) as f:
                f.write(str_to_bytes(dumps(payload)))
            os.replace(tmp, final)
        except OSError as exc:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc


class FilesystemTransport(filesystem.Transport):
    """kombu's filesystem transport using :class:`FilesystemChannel`."""

    Channel = FilesystemChannel
