"""Listeners: called in the order they started listening, each only while its block runs, and
gone after a block that raised."""
from __future__ import annotations

import pytest

from mmdropit.common.listeners import Listeners


def test_nested_listeners_hear_in_order_and_only_inside_their_block():
    heard: list[tuple[str, int, str]] = []
    events: Listeners[[int, str]] = Listeners()
    with events.listening(lambda n, what: heard.append(('outer', n, what))):
        events.notify(1, 'a')
        with events.listening(lambda n, what: heard.append(('inner', n, what))):
            events.notify(2, what='b')
        events.notify(3, 'c')
    events.notify(4, 'd')
    assert heard == [('outer', 1, 'a'), ('outer', 2, 'b'), ('inner', 2, 'b'), ('outer', 3, 'c')]


def test_a_listener_stops_listening_when_its_block_raises():
    events: Listeners[[int]] = Listeners()
    with pytest.raises(ValueError):
        with events.listening(print):
            raise ValueError('inside')
    assert not events


def test_one_listener_may_listen_twice():
    heard: list[int] = []
    events: Listeners[[int]] = Listeners()
    with events.listening(heard.append), events.listening(heard.append):
        events.notify(7)
    events.notify(8)
    assert heard == [7, 7] and not events
