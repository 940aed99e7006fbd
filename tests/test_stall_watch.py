"""The stall watch (ps_cluster/stall_watch.py): in-process, its decisions
and the line it ends a worker with, for a failure handed over, a step that
stands still, a ps or a worker that is silent; and the cluster test of what
only a cluster shows: a run that makes no step, or that lost a ps for good,
ends every worker, naming why."""

import os
import queue
import signal
import socket
import threading
import time

import pytest

from conftest import (LONG_RUN, SCRIPTS, START_UP, assert_clean_exit,
                      assert_one_error_line, ps_port)
from ps_cluster.exits import TaskFailed
from ps_cluster.stall_watch import StallWatch

PS = '/job:ps/task:0 (localhost:1)'
WORKER = '/job:worker/task:1 (localhost:3)'


class Die:
    """A worker's TaskEnd.fail(message), the watch's last resort, never
    returns: it ends the process. This one parks the watch's thread for
    good instead, and keeps what it was handed."""

    def __init__(self):
        self.said = queue.Queue()

    def fail(self, message):
        self.said.put(message)
        threading.Event().wait()

    def first(self):
        return self.said.get(timeout=5)


@pytest.fixture
def die(monkeypatch):
    monkeypatch.setattr(StallWatch, 'POLL_SECS', 0.02)
    monkeypatch.setattr(StallWatch, 'PROBE_SECS', 0.05)
    monkeypatch.setattr(StallWatch, 'CALL_SECS', 0.1)
    monkeypatch.setattr(StallWatch, 'GRACE_SECS', 0.05)
    return Die()


def started(*args):
    watch = StallWatch(*args)
    watch.start()
    return watch


def test_a_failure_handed_over_ends_the_worker_at_once(die, monkeypatch):
    # Not at the next poll: at once, and before watch().
    monkeypatch.setattr(StallWatch, 'POLL_SECS', 60)
    watch = started(60, 60, die)
    watch.fail('the data ran out')
    watch.fail('lost the connection to ' + PS)
    assert die.first() == 'the data ran out'


def test_a_failure_is_raised_in_the_main_thread_once_it_is_unblocked(die):
    unblocked = threading.Event()
    watch = started(60, 60, die)
    watch.watch(lambda: [], lambda: [], unblocked.set)
    watch.raise_if_failed()  # none yet
    watch.fail('the data ran out')
    # The main thread's session run, cancelled by unblock(), raises it.
    assert unblocked.wait(5)
    with pytest.raises(TaskFailed, match='^the data ran out$'):
        watch.raise_if_failed()
    # The main thread did not end the worker: the last resort does.
    assert die.first() == 'the data ran out'


def test_a_check_while_waiting_that_returns_a_message_is_a_failure(die):
    watch = started(60, 60, die)
    answers = iter([None, 'lost the connection to ' + PS])
    with watch.waiting_in('opening a session', True, lambda: next(answers),
                          0.05):
        assert die.first() == 'lost the connection to ' + PS


def test_before_watch_a_standing_step_ends_nothing(die):
    watch = started(0.05, 0.05, die)
    watch.step(3)
    time.sleep(0.3)  # many polls, past secs
    watch.fail('over')
    assert die.first() == 'over'


@pytest.mark.parametrize('silent_workers, missing', [
    ([WORKER], WORKER), ([], 'none')])
def test_no_step_for_secs_ends_the_worker_naming_the_silent_workers(
        die, silent_workers, missing):
    watch = started(0.2, 60, die)
    with watch.waiting_in('the sync token queue'):
        watch.watch(lambda: [], lambda: silent_workers, None)
        assert die.first() == (
            'training stalled: no new global step for 0.2 s, waiting in '
            'the sync token queue; missing: ' + missing)


def test_a_silent_ps_is_named_after_ps_secs(die):
    watch = started(60, 0.1, die)
    # A wait that is over says nothing any more.
    with watch.waiting_in('opening a session', watch_ps=False):
        pass
    watch.watch(lambda: [PS, '/job:ps/task:1 (localhost:2)'], lambda: [],
                None)
    assert die.first() == (
        'training stalled: no new global step for 0.1 s, waiting in a '
        'training run; ' + PS + ' does not answer, /job:ps/task:1 '
        '(localhost:2) does not answer')


def test_a_wait_without_watch_ps_leaves_a_lost_ps_to_the_wait(die):
    watch = started(0.4, 0.05, die)
    with watch.waiting_in('opening a session', watch_ps=False):
        watch.watch(lambda: [PS], lambda: [], None)
        # Not after ps_secs: after secs, which the line says.
        assert die.first() == (
            'training stalled: no new global step for 0.4 s, waiting in '
            'opening a session; ' + PS + ' does not answer')


def test_steps_that_move_keep_the_watch_quiet(die):
    watch = started(1, 1, die)
    watch.watch(lambda: [PS], lambda: [WORKER], None)
    deadline = time.monotonic() + 2
    step = 0
    while time.monotonic() < deadline:
        step += 1
        watch.step(step)
        time.sleep(0.01)
    watch.fail('over')
    assert die.first() == 'over'


def test_a_step_read_again_has_not_moved(die):
    watch = started(0.2, 60, die)
    watch.watch(lambda: [], lambda: [WORKER], None)
    deadline = time.monotonic() + 5
    while die.said.empty() and time.monotonic() < deadline:
        watch.step(7)
        time.sleep(0.01)
    assert die.first() == (
        'training stalled: no new global step for 0.2 s, waiting in a '
        'training run; missing: ' + WORKER)


def test_after_close_a_stall_ends_nothing_and_a_failure_is_raised(die):
    watch = started(0.05, 0.05, die)
    watch.watch(lambda: [PS], lambda: [WORKER], None)
    watch.close()
    time.sleep(0.3)  # many polls, past secs
    watch.fail('the chief ended: "interrupted"')
    # The main thread's, now: the watch ends nothing.
    with pytest.raises(TaskFailed, match='the chief ended'):
        watch.raise_if_failed()
    assert die.said.empty()


def test_close_while_a_ps_is_called_ends_nothing(die, monkeypatch):
    # The call answers, late: it names the ps after close().
    monkeypatch.setattr(StallWatch, 'CALL_SECS', 60)
    called, answer = threading.Event(), threading.Event()

    def silent_ps():
        called.set()
        answer.wait()
        return [PS]
    watch = started(60, 0.05, die)
    watch.watch(silent_ps, lambda: [], None)
    assert called.wait(5)
    closing = threading.Thread(target=watch.close)
    closing.start()
    while not watch._closed:  # close() said, before the answer comes
        time.sleep(0.01)
    answer.set()
    closing.join(5)
    assert not closing.is_alive()
    watch.raise_if_failed()  # nothing stored
    assert die.said.empty()


def test_calls_that_block_past_call_secs_are_given_up_on(die):
    frozen = threading.Event()  # a frozen ps, thawed when the test is done
    watch = started(0.3, 0.05, die)
    try:
        watch.watch(frozen.wait, frozen.wait, None)
        # The ps given up on counts as answering; the workers as unknown.
        assert die.first() == (
            'training stalled: no new global step for 0.3 s, waiting in a '
            'training run; missing: unknown')
    finally:
        # Threads left in a call would hold the interpreter's exit.
        frozen.set()


# A run that cannot go on ends every worker, each naming why, side by side.
# Stalled: a frozen ps (async, sync), which accepts connections and answers
# nothing (only a call with a deadline tells it from a live one; the line
# names the ps, never the worker itself, which a failed call's error may
# name); and a sync chief killed, without which no update is applied. A ps
# lost for good (async, sync), after --ps_timeout; and one that dies as a
# worker probes it: it may still accept connections, and the worker then
# opens a new session, which waits in TensorFlow for the ps with no timeout.
# Another process answering at its port a moment makes every worker do so.
@pytest.mark.slow  # not in the fast tier
def test_a_stalled_run_or_a_lost_ps_ends_every_worker_naming_why(
        procs, free_ports, small_data):

    def training(*args, **kwargs):
        # Each cluster trains before the next starts: a start-up beside
        # five others may leave the steps still for longer than the short
        # timeouts here, which are the faults' to trip.
        ps, workers = procs.cluster(*args, **kwargs)
        procs.wait_for_epoch(workers)
        return ps, workers
    frozen = {script: training(script, free_ports, '--data_dir=' + small_data,
                               '--stall_timeout=10', *LONG_RUN,
                               name=script + '-frozen-')
              for script in SCRIPTS}
    ps, workers = training('sync', free_ports, '--data_dir=' + small_data,
                           '--stall_timeout=5', *LONG_RUN, name='no-chief-')
    lost = {(script, its_port): training(
        script, free_ports, '--data_dir=' + small_data, '--ps_timeout=5',
        *LONG_RUN, name=script + its_port)
        for script, its_port in (('async', 'closed'), ('sync', 'closed'),
                                 ('sync', 'answering'))}
    for frozen_ps, _ in frozen.values():
        os.kill(frozen_ps.pid, signal.SIGSTOP)
    stopped = time.time()
    os.kill(workers[0].pid, signal.SIGKILL)
    for lost_ps, _ in lost.values():
        os.kill(lost_ps.pid, signal.SIGKILL)
    killed = time.time()
    answering = lost['sync', 'answering'][0]
    answering.wait()
    with socket.create_server(('', ps_port(answering))):
        time.sleep(2)

    procs.wait_all([w for (_, its_port), (_, run_workers) in lost.items()
                    if its_port == 'closed' for w in run_workers], START_UP,
                   since=killed)
    procs.wait_all(lost['sync', 'answering'][1], START_UP)
    for lost_ps, run_workers in lost.values():
        for i, worker in enumerate(run_workers):
            # TensorFlow logs the broken connection too; ours is the last
            # line.
            assert_clean_exit(procs, worker, 1)
            last = procs.stderr(worker).splitlines()[-1]
            assert last == ('/job:worker/task:%d: error: lost the connection '
                            'to /job:ps/task:0 (localhost:%d)'
                            % (i, ps_port(lost_ps)))

    procs.wait_all(workers + [ps], START_UP, since=stopped)
    for worker in workers[1:]:
        assert_one_error_line(
            procs, worker, 1, 'training stalled: no new global step for 5 s',
            'missing: /job:worker/task:0 (localhost:')
    assert_clean_exit(procs, ps, 0)
    procs.wait_all([w for _, ws in frozen.values() for w in ws], START_UP,
                   since=stopped)
    for frozen_ps, frozen_workers in frozen.values():
        for i, worker in enumerate(frozen_workers):
            assert_one_error_line(
                procs, worker, 1,
                'training stalled: no new global step for 10 s',
                '/job:ps/task:0 (localhost:%d) does not answer'
                % ps_port(frozen_ps))
            assert 'lost the connection to /job:worker/task:%d ' % i \
                not in procs.output(worker)
        os.kill(frozen_ps.pid, signal.SIGCONT)
