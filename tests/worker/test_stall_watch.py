"""The stall watch (ps_cluster/worker/stall_watch.py): in-process, what it
stores and when it ends a worker: a failure stored while the main thread runs
Python is the main thread's to raise; one stored while it is inside a call into
TensorFlow closes the call's session, and ends the worker only if the call
still has not returned GRACE_SECS later; a step that stands still during a call
is a failure that names a silent ps or the silent workers. And the cluster test
of what only a cluster shows: a run that makes no step, or that lost a ps for
good, ends every worker, naming why."""

import os
import queue
import signal
import socket
import threading
import time

import pytest

from conftest import (LONG_RUN, SCRIPTS, START_UP, assert_clean_exit,
                      assert_one_error_line, ps_port)

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
import tensorflow.compat.v1 as tf  # noqa: E402

from ps_cluster import errors, liveness, probes  # noqa: E402
from ps_cluster.deadlines import Deadline, Limit, Outage, poll  # noqa: E402
from ps_cluster.sources import Place  # noqa: E402
from ps_cluster.worker.stall_watch import StallWatch  # noqa: E402

CLUSTER = tf.train.ClusterSpec({'ps': ['localhost:1', 'localhost:2'],
                                'worker': ['localhost:3', 'localhost:4']})
PS = '/job:ps/task:0 (localhost:1)'
WORKER = '/job:worker/task:1 (localhost:4)'


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


class Session:
    """A session the main thread is stuck in: close() is counted, and
    frees the call if `cancels`."""

    def __init__(self, cancels):
        self.cancels, self.closed = cancels, threading.Event()

    def close(self):
        self.closed.set()


@pytest.fixture
def die(monkeypatch):
    monkeypatch.setattr(StallWatch, 'POLL_SECS', 0.02)
    monkeypatch.setattr(StallWatch, 'GRACE_SECS', 0.1)
    monkeypatch.setattr(liveness, 'GONE_SECS', 0.1)
    monkeypatch.setattr(probes, 'silent', lambda cluster, job: [])
    monkeypatch.setattr(liveness, 'silent_workers', lambda *_: [WORKER])
    return Die()


def started(die, secs=60, ps_secs=60):
    """A watch started, storing in the coordinator of a session: its
    `coord`."""
    watch = StallWatch(die, Place(CLUSTER, 'worker', 0),
                       Limit(secs, '--stall_timeout'),
                       Outage(Limit(ps_secs, '--ps_timeout')))
    watch.coord = tf.train.Coordinator()
    watch.store_in(watch.coord)
    watch.start()
    return watch


def test_a_failure_stored_while_the_main_thread_runs_python_is_its_own(die):
    watch = started(die)
    errors.fail(watch.coord, 'the chief went away')
    errors.fail(watch.coord, 'lost the connection to ' + PS)
    time.sleep(0.5)  # many polls, past the grace
    assert die.said.empty()
    # The first stored is the one the main thread raises.
    assert errors.stored(watch.coord).message == 'the chief went away'
    watch.close()


def test_a_failure_stored_during_a_call_closes_its_session(die):
    watch = started(die)
    session = Session(cancels=True)
    with watch.calling('a training run', session):
        errors.fail(watch.coord, 'the data ran out')
        assert session.closed.wait(5)
    # The call returned: the main thread raises the failure, not the watch.
    time.sleep(0.5)
    assert die.said.empty()
    watch.close()


def test_a_call_still_stuck_after_the_grace_ends_the_worker(die):
    watch = started(die)
    session = Session(cancels=False)
    with watch.calling('a training run', session):
        errors.fail(watch.coord, 'the data ran out')
        assert die.first() == 'the data ran out'
    assert session.closed.is_set()


def test_a_lost_ps_stored_closes_nothing_and_ends_after_ps_secs(die):
    # The run on the lost ps fails by itself; closing would wait on it.
    watch = started(die, ps_secs=0.5)
    session = Session(cancels=False)
    with watch.calling('a training run', session):
        try:
            raise tf.errors.UnavailableError(None, None, 'Socket closed')
        except tf.errors.UnavailableError as e:
            watch.coord.request_stop(e)
        started_at = time.time()
        assert die.first() == (
            'lost the connection to a ps task (localhost:1,localhost:2), '
            'which did not come back within 0.5 s (--ps_timeout)')
        assert time.time() - started_at >= 0.5
    assert not session.closed.is_set()


def test_a_loss_is_waited_for_from_when_it_was_first_found(die):
    # Found by a recovery 60 s ago (--ps_timeout 60): a run that meets it
    # now has none of the wait left, and the worker ends at once.
    watch = started(die, ps_secs=60)
    watch.outage.found()
    watch.outage._since -= 60
    with watch.calling('a training run', Session(cancels=False)):
        lost = tf.errors.UnavailableError(None, None, 'Socket closed')
        watch.coord.request_stop((type(lost), lost, None))
        assert die.first().endswith('within 60 s (--ps_timeout)')


def test_a_step_ends_a_loss(die):
    watch = started(die)
    watch.step(6)
    since = watch.outage.found()
    watch.step(6)  # read again: no step
    assert watch.outage.found() == since
    watch.step(7)
    assert watch.outage.found() > since  # a loss found anew
    watch.close()


def test_no_step_for_secs_during_a_call_names_the_silent_workers(die):
    watch = started(die, secs=0.2)
    with watch.calling('the sync token queue'):
        line = die.first()
    assert line == (
        'training stalled: no new global step for 0.2 s (--stall_timeout), '
        'waiting in the sync token queue; missing: ' + WORKER)
    assert errors.stored(watch.coord).message == line


def test_a_run_stuck_while_every_task_answers_gets_one_new_session(
        die, monkeypatch):
    monkeypatch.setattr(liveness, 'silent_workers', lambda *_: [])
    watch = started(die, secs=0.2)
    watch.step(5)
    # Stuck: the watch closes its session, and a new session is tried,
    # as after a lost ps.
    session = Session(cancels=True)
    with watch.calling('a training run', session):
        assert session.closed.wait(5)
    stuck = errors.stored(watch.coord)
    assert isinstance(stuck, errors.Stuck) and errors.is_lost(stuck)
    assert stuck.message == (
        'no new global step for 0.2 s (--stall_timeout), waiting in a '
        'training run, while every task answers')
    # The next session stuck at the same step: the worker ends.
    watch.coord = tf.train.Coordinator()
    watch.store_in(watch.coord)
    with watch.calling('a training run'):
        assert die.first() == (
            'training stalled: no new global step for 0.2 s '
            '(--stall_timeout), waiting in a training run; missing: none')


def test_a_step_that_stops_during_a_call_is_no_run_stuck_alone(
        die, monkeypatch):
    # The others stepped early in the call, then the ps froze: the run
    # is stalled for every worker, and the line names the ps.
    monkeypatch.setattr(probes, 'silent', lambda cluster, job: [0])
    watch = started(die, secs=0.3, ps_secs=60)
    with watch.calling('a training run'):
        watch.step(1)
        watch.step(2)
        assert die.first() == (
            'training stalled: no new global step for 0.3 s '
            '(--stall_timeout), waiting in a training run; ' + PS +
            ' does not answer')


def test_a_silent_ps_is_named_after_ps_secs(die, monkeypatch):
    monkeypatch.setattr(probes, 'silent', lambda cluster, job: [0, 1])
    watch = started(die, ps_secs=0.1)
    with watch.calling('opening a session'):
        assert die.first() == (
            'training stalled: no new global step for 0.1 s (--ps_timeout), '
            'waiting in opening a session; ' + PS + ' does not answer, '
            '/job:ps/task:1 (localhost:2) does not answer')


def silent_ps(monkeypatch, *silent):
    """probes.silent says the ps tasks in the list it returns are silent,
    until the list is changed; the other list counts the probes made."""
    silent, made = list(silent), []

    def probe(cluster, job):
        made.append(None)
        return list(silent)
    monkeypatch.setattr(probes, 'silent', probe)
    return silent, made


def test_a_ps_that_misses_a_probe_is_not_lost(die, monkeypatch):
    # As a network cut heals, the watch's probe of the ps fails once, past
    # ps_secs without a step; the next answers, and nothing is stored.
    silent, made = silent_ps(monkeypatch, 0)
    watch = started(die, secs=60, ps_secs=0.05)
    with watch.calling('a training run'):
        assert poll(lambda: made, 10, 0.01)
        silent.clear()
        assert poll(lambda: len(made) > 10, 10, 0.01)  # past GONE_SECS
    assert die.said.empty() and errors.stored(watch.coord) is None
    watch.close()


def test_a_step_starts_the_silence_of_a_ps_anew(die, monkeypatch):
    # The ps silent, a step, the ps silent again, past GONE_SECS since it
    # first was but not since the step; then it answers: not lost.
    monkeypatch.setattr(liveness, 'GONE_SECS', 2)
    silent, made = silent_ps(monkeypatch, 0)
    watch = started(die, secs=60, ps_secs=0.05)
    watch.step(1)
    with watch.calling('a training run'):
        time.sleep(1.2)
        watch.step(2)
        time.sleep(1.2)
        silent.clear()
        probes_made = len(made)
        assert poll(lambda: len(made) > probes_made + 5, 10, 0.01)
    assert die.said.empty() and errors.stored(watch.coord) is None
    watch.close()


def test_a_call_past_its_waits_deadline_with_a_silent_ps_lost_it(
        die, monkeypatch):
    silent = []
    monkeypatch.setattr(probes, 'silent', lambda cluster, job: silent)
    watch = started(die, secs=0.05, ps_secs=0.05)
    with watch.calling('the first beat',
                       deadline=Deadline(Limit(0.3, '--startup_timeout'))):
        # Neither the stall rules, nor the deadline while the ps answers.
        time.sleep(0.6)
        assert errors.stored(watch.coord) is None
        silent.append(0)
        assert die.first() == (
            'lost the connection to ' + PS + ', waiting in the first beat: '
            'not done within 0.3 s (--startup_timeout)')


def test_outside_a_call_a_standing_step_ends_nothing(die):
    watch = started(die, secs=0.05, ps_secs=0.05)
    watch.step(3)
    time.sleep(0.5)  # many polls, past secs: a wait of the main thread's
    assert die.said.empty() and errors.stored(watch.coord) is None
    watch.close()


def test_steps_that_move_keep_the_watch_quiet(die):
    # Training runs, each shorter than secs, for twice secs.
    watch = started(die, secs=1, ps_secs=1)
    deadline = time.monotonic() + 2
    step = 0
    while time.monotonic() < deadline:
        with watch.calling('a training run'):
            step += 1
            watch.step(step)
            time.sleep(0.01)
    assert errors.stored(watch.coord) is None
    watch.close()


def stuck_alone(watch):
    """A training run in which this worker is stuck while the others'
    steps move the global step (async), until the watch closes its
    session: the failure stored."""
    session = Session(cancels=True)
    with pytest.raises(tf.errors.CancelledError):
        with watch.calling('a training run', session, trains=True):
            step = 0
            while not session.closed.wait(0.01):
                step += 1
                watch.step(step)
            # The run that closing its session cancels.
            raise tf.errors.CancelledError(None, None, 'Session closed')
    return errors.stored(watch.coord)


def test_a_run_stuck_alone_while_the_others_train_gets_a_new_session(die):
    # This worker's run has lasted secs.
    watch = started(die, secs=0.3, ps_secs=60)
    stuck = stuck_alone(watch)
    assert isinstance(stuck, errors.Stuck) and errors.is_lost(stuck)
    assert stuck.message == (
        'no step of its own for 0.3 s (--stall_timeout), waiting in a '
        'training run, while the global step goes on')
    assert die.said.empty()
    # The recovery's own calls return (the farewells read, the step read
    # as the new session starts); then stuck alone again, before a
    # training run returned: the worker ends.
    watch.coord = tf.train.Coordinator()
    watch.store_in(watch.coord)
    with watch.calling("reading the ps tasks' farewells",
                       deadline=Deadline(Limit(60, '--ps_timeout'))):
        pass
    with watch.calling('reading the global step'):
        pass
    with watch.calling('a training run', trains=True):
        step, deadline = 100, time.monotonic() + 10
        while die.said.empty() and time.monotonic() < deadline:
            step += 1
            watch.step(step)
            time.sleep(0.01)
    assert die.first() == (
        'training stalled: no step of its own for 0.3 s (--stall_timeout), '
        'waiting in a training run, while the global step goes on, in a new '
        'session too')


def test_a_run_stuck_alone_after_a_training_run_returned_gets_one_more(die):
    watch = started(die, secs=0.3, ps_secs=60)
    assert isinstance(stuck_alone(watch), errors.Stuck)
    watch.coord = tf.train.Coordinator()
    watch.store_in(watch.coord)
    # The new session carried the run on: a training run returned.
    with watch.calling('a training run', trains=True):
        pass
    assert isinstance(stuck_alone(watch), errors.Stuck)
    assert die.said.empty()


def test_a_step_read_again_has_not_moved(die):
    watch = started(die, secs=0.2)
    with watch.calling('a training run'):
        deadline = time.monotonic() + 5
        while die.said.empty() and time.monotonic() < deadline:
            watch.step(7)
            time.sleep(0.01)
        assert die.first() == (
            'training stalled: no new global step for 0.2 s '
            '(--stall_timeout), waiting in a training run; missing: '
            + WORKER)


def test_after_close_nothing_is_stored_or_ended(die):
    watch = started(die, secs=0.05, ps_secs=0.05)
    watch.close()
    with watch.calling('a training run'):
        time.sleep(0.3)  # many polls, past secs
    assert die.said.empty() and errors.stored(watch.coord) is None


def test_probes_that_block_are_given_up_on(die, monkeypatch):
    frozen = threading.Event()  # a frozen ps, thawed when the test is done
    monkeypatch.setattr(probes, 'silent', lambda cluster, job: frozen.wait())
    monkeypatch.setattr(liveness, 'silent_workers',
                        lambda *_: frozen.wait())
    watch = started(die, secs=0.3, ps_secs=0.05)
    try:
        with watch.calling('a training run'):
            # The ps given up on counts as answering; the workers as
            # unknown.
            assert die.first() == (
                'training stalled: no new global step for 0.3 s '
                '(--stall_timeout), waiting in a training run; missing: '
                'unknown')
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
                            'to /job:ps/task:0 (localhost:%d), which did not '
                            'come back within 5 s (--ps_timeout)'
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


@pytest.mark.slow  # not in the fast tier
def test_a_straggler_slower_than_the_stall_timeout_is_said_so(
        procs, free_ports, small_data):
    # Worker 1's every run waits 8 s, past --stall_timeout, on a pool of one
    # thread, as on a host of few CPUs, while the chief trains on: its line
    # says that its own run is stuck, not the global step.
    ports = free_ports(3)
    flags = ['--data_dir=' + small_data, '--stall_timeout=3',
             '--pool_threads=1', *LONG_RUN]
    ps = procs.script('async', 'ps', 0, ports[:1], ports[1:], *flags)
    chief = procs.script('async', 'worker', 0, ports[:1], ports[1:], *flags)
    procs.wait_for_epoch([chief])
    worker = procs.script('async', 'worker', 1, ports[:1], ports[1:], *flags,
                          '--step_delay_ms=8000')
    said = procs.wait_for_output(worker, r'^worker=1: no .*', START_UP)
    assert said.group(0) == (
        'worker=1: no step of its own for 3 s (--stall_timeout), waiting in '
        'a training run, while the global step goes on; trying a new '
        'session')
    for task in (ps, chief, worker):
        os.kill(task.pid, signal.SIGINT)
    procs.wait_all([ps, chief, worker], START_UP)
