"""The dispatch message's envelope (dispatch.py): what a message carries, and that a message
written by an older release (with the store code ``"b"``) still parses."""

from __future__ import annotations

import pytest

from django_debounce.dispatch import VERSION, Message, message_of, parse_message
from django_debounce.state import Dispatch

H = "a" * 64


def test_a_message_carries_the_key_hash_the_sequence_and_the_version():
    message = message_of(Dispatch(H, 7, 0.5, "app.task", "app.task:x"))
    assert message == {"k": H, "s": 7, "v": VERSION}
    assert parse_message(message) == Message(H, 7)


@pytest.mark.parametrize("code", ["d", "r"])
def test_the_store_code_of_an_older_message_is_ignored(code):
    assert parse_message({"k": H, "s": 7, "b": code, "v": VERSION}) == Message(H, 7)


def test_a_redelivered_message_keeps_its_attempt_count_out_of_the_parse():
    assert parse_message({"k": H, "s": 7, "n": 3, "v": VERSION}) == Message(H, 7)
