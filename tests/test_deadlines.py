"""Waiting within a deadline (ps_cluster/deadlines.py): a wait's deadline,
the one clock of a loss that may come back, a call that blocks left to its
thread, a condition polled."""

import threading
import time

import pytest

from ps_cluster.deadlines import Deadline, Limit, Outage, call_within, poll


def test_a_deadline_from_a_time_past_says_its_flag():
    deadline = Deadline(Limit(10, '--ps_timeout'), since=time.monotonic() - 4)
    assert 5 < deadline.left() <= 6
    assert str(deadline) == 'within 10 s (--ps_timeout)'
    assert Deadline(Limit(1, '--x'), since=time.monotonic() - 2).left() == 0


def test_an_outage_runs_from_when_it_was_first_found_until_over():
    outage = Outage(Limit(60, '--ps_timeout'))
    since = outage.found()
    assert outage.found() == since  # one loss, one start, whoever finds it
    assert outage.deadline().at == since + 60
    assert str(outage.deadline()) == 'within 60 s (--ps_timeout)'
    outage.over()
    assert outage.found() > since  # a new loss starts anew


def test_a_call_that_blocks_is_left_to_its_thread():
    blocked = threading.Event()
    with pytest.raises(TimeoutError, match='no answer within 0.1 s'):
        call_within(0.1, blocked.wait)
    assert call_within(1, lambda: 7) == 7
    with pytest.raises(ZeroDivisionError):
        call_within(1, lambda: 1 / 0)
    blocked.set()


def test_poll_returns_the_first_true_value_or_the_last_false_one():
    values = iter([0, '', 'yes'])
    assert poll(lambda: next(values), 5, 0) == 'yes'
    assert poll(lambda: 0, 0.05, 0.01) == 0
