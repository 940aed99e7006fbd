"""A worker's Watchdog (ps_cluster/worker/watchdog.py): in-process, with
servers of one cluster in the test's own process, it beats, tells each
global step it reads, stores a ps's farewell as its failure, reads why a
chief left, names a worker that left once, beats alone once its beats miss
their deadline, and waits for the others."""

import contextlib
import os
import queue
import threading
import time

import numpy as np
import pytest

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
import tensorflow.compat.v1 as tf  # noqa: E402

from ps_cluster import errors, liveness, server, sources  # noqa: E402
from ps_cluster.deadlines import Deadline, Limit  # noqa: E402
from ps_cluster.exits import TaskFailed  # noqa: E402
from ps_cluster.worker.watchdog import Watchdog  # noqa: E402

from ps_counters import (beat, beats_and_reasons, done, on_ps,  # noqa: E402
                         start, start_ps)

tf.disable_v2_behavior()


class Watch:
    """What a Watchdog tells the StallWatch: the global steps it reads, and
    the main thread's calls."""

    def __init__(self, on_step):
        self.step = on_step or (lambda step: None)

    @contextlib.contextmanager
    def calling(self, what, session=None, deadline=None):
        yield


class Tokens:
    """What a sync Watchdog asks of SyncTokens when a worker departs."""

    def __init__(self, on_departure):
        self.on_departure = lambda session: on_departure()


@contextlib.contextmanager
def watchdog(cluster, index, startup_timeout=10, on_step=None,
             on_departure=None, training=False, slot=None):
    """Worker `index`'s Watchdog, on a server of its own, beside the
    Supervisor of a model that is its global step alone; with `training`,
    watching a session in which the model is initialized. Stopped at the
    end."""
    worker = start(cluster, 'worker', index)
    config = server.session_config('worker', index)
    with tf.Graph().as_default():
        with tf.device(tf.train.replica_device_setter(
                worker_device='/job:worker/task:%d' % index,
                cluster=cluster)):
            global_step = tf.train.get_or_create_global_step()
        init_op = tf.global_variables_initializer()
    dog = Watchdog(tf.train.Coordinator(), global_step, worker, config,
                   sources.Place(cluster, 'worker', index), Watch(on_step),
                   Deadline(Limit(startup_timeout, '--startup_timeout')),
                   on_departure and Tokens(on_departure), slot)
    sess = tf.Session(worker.target, graph=global_step.graph, config=config)
    try:
        if training:
            sess.run(init_op)
            dog.sess = sess
        yield dog
    finally:
        dog.coord.request_stop()
        try:
            dog.coord.join()
        except TaskFailed:  # the failure the test read
            pass
        dog.session.close()
        sess.close()


def stored_failure(dog):
    """The failure the Watchdog stored in its coordinator, once it has."""
    assert dog.coord.wait_for_stop(10)
    return errors.stored(dog.coord).message


def test_a_watchdog_without_counters_fails_after_the_startup_timeout(
        shared_cluster):
    cluster = shared_cluster(1, 2)
    start(cluster, 'ps', 0)  # which sets up no counters
    with pytest.raises(TaskFailed) as failed:
        with watchdog(cluster, 1, startup_timeout=0.5):
            pass
    assert failed.value.message == ('the ps tasks did not set up their '
                                    'liveness counters within 0.5 s '
                                    '(--startup_timeout)')


def test_a_ps_farewell_ends_the_worker_quoting_it(shared_cluster):
    cluster = shared_cluster(1, 2)
    ps = start_ps(cluster, 0)
    with watchdog(cluster, 0) as dog:
        ps.tell_workers('the ps was told to stop', 1)
        assert stored_failure(dog) == (
            'lost the connection to /job:ps/task:0 (%s), which ended: '
            '"the ps was told to stop"' % cluster.task_address('ps', 0))


def test_a_waiting_worker_reads_why_the_chief_left(shared_cluster):
    # Its main thread, waiting for the model, then quotes it
    # (test_recoverable_session.py).
    cluster = shared_cluster(1, 2)
    start_ps(cluster, 0)
    with watchdog(cluster, 1) as dog:
        assert dog.chief_left() is None
        liveness.say_left(cluster, 0, 'bad data')
        assert dog.chief_left() == 'bad data'


def test_the_watched_training_tells_each_global_step_it_reads(shared_cluster):
    cluster = shared_cluster(1, 2)
    start_ps(cluster, 0)
    steps = queue.Queue()
    with watchdog(cluster, 1, on_step=steps.put, training=True):
        assert steps.get(timeout=10) == 0


def test_a_worker_that_left_during_training_is_named_once(shared_cluster,
                                                          capsys):
    cluster = shared_cluster(1, 2)
    ps = start_ps(cluster, 0)
    # The ps counts the departures that the Watchdog reads.
    serving = threading.Thread(target=ps.serve_until_workers_gone, args=(
        Limit(10, '--startup_timeout'), Limit(10, '--worker_timeout')),
        daemon=True)
    serving.start()
    asked, steps = queue.Queue(), queue.Queue()

    def is_gone():
        asked.put(True)
        return True

    with watchdog(cluster, 0, on_step=steps.put, on_departure=is_gone,
                  training=True) as dog:
        liveness.say_left(cluster, 1, 'bad data')
        asked.get(timeout=10)
        # Two more polls' steps: not asked again.
        for _ in range(steps.qsize() + 2):
            steps.get(timeout=10)
        assert asked.empty()
        dog.mark_done()
    serving.join(10)
    assert not serving.is_alive()
    assert capsys.readouterr().out == (
        'worker=0: /job:worker/task:1 (%s) is gone; training goes on '
        'without it\n' % cluster.task_address('worker', 1))


def test_a_beat_that_lands_after_a_worker_is_done_leaves_it_done(
        shared_cluster):
    cluster = shared_cluster(1, 2)
    start_ps(cluster, 0)
    done(cluster, 1)
    beat(cluster, 1)  # on its way as the worker marked its slot
    [beats] = [on_ps(cluster, 0, lambda beats, *_: beats)]
    assert beats[1] < 0 and not liveness.has_left(beats[1])


def test_a_worker_told_to_leave_as_it_first_beats_stays_left(shared_cluster):
    # SIGTERM (a scale-down) said LEFT from the signals' thread as the main
    # thread's first beat was on its way: the first beat does not count the
    # worker anew.
    cluster = shared_cluster(1, 2)
    start_ps(cluster, 0)
    slot = liveness.Slot()
    liveness.say_left(cluster, 1, 'left on SIGTERM (a scale-down)', 0, slot)
    with watchdog(cluster, 1, slot=slot):
        pass
    beats, reasons = beats_and_reasons(cluster, 0)
    assert liveness.has_left(beats[1])
    assert reasons[1] == b'left on SIGTERM (a scale-down)'


class StuckSession:
    """A session on a connection stuck after a network cut healed, or whose
    worker's op pool a run holds: each run waits out its deadline."""

    def __init__(self, session):
        self.session = session

    def run(self, fetches, options):
        time.sleep(options.timeout_in_ms / 1000)
        raise tf.errors.DeadlineExceededError(None, None, 'Timed out')

    def close(self):
        self.session.close()


def test_a_watchdog_whose_beats_miss_their_deadline_beats_alone(
        shared_cluster, monkeypatch):
    # Its beats wait out their deadline while the ps answers, which hears
    # them over connections of their own, more often than GONE_SECS, after
    # which it would count the worker gone.
    cluster = shared_cluster(1, 2)
    start_ps(cluster, 0)
    with watchdog(cluster, 1) as dog:
        monkeypatch.setattr(dog, 'session', StuckSession(dog.session))
        heard = [on_ps(cluster, 0, lambda beats, *_: beats)[1]]
        moved, deadline = [], time.monotonic() + 30
        # Past the first deadline, then a few of the beats alone.
        while len(moved) < 4 and time.monotonic() < deadline:
            beats = on_ps(cluster, 0, lambda beats, *_: beats)[1]
            if beats != heard[-1]:
                heard.append(beats)
                moved.append(time.monotonic())
            time.sleep(0.05)
        assert len(moved) == 4
        assert max(np.diff(moved[1:])) < liveness.GONE_SECS / 2
        assert errors.stored(dog.coord) is None


def test_a_watchdog_beating_alone_reads_the_step_and_the_farewells(
        shared_cluster, monkeypatch):
    # Alone, it still tells the stall watch each global step, and stores a
    # ps's farewell, as it does over its own connection.
    cluster = shared_cluster(1, 2)
    ps = start_ps(cluster, 0)
    steps = queue.Queue()
    with watchdog(cluster, 1, on_step=steps.put, training=True) as dog:
        assert steps.get(timeout=10) == 0
        monkeypatch.setattr(dog, 'session', StuckSession(dog.session))
        monkeypatch.setattr(dog, 'sess', StuckSession(dog.sess))
        with tf.Graph().as_default():
            with tf.device('/job:ps/task:0'):
                step = tf.train.get_or_create_global_step()
            with tf.Session('grpc://' + cluster.task_address('ps', 0)) as sess:
                sess.run(step.assign(7))
        told, deadline = None, time.monotonic() + 30
        while told != 7 and time.monotonic() < deadline:
            with contextlib.suppress(queue.Empty):
                told = steps.get(timeout=1)
        assert told == 7
        ps.tell_workers('the ps was told to stop', 1)
        assert stored_failure(dog) == (
            'lost the connection to /job:ps/task:0 (%s), which ended: '
            '"the ps was told to stop"' % cluster.task_address('ps', 0))


def test_wait_for_the_others_returns_once_the_others_are_done(shared_cluster):
    cluster = shared_cluster(1, 2)
    start_ps(cluster, 0)
    with watchdog(cluster, 0) as dog:
        beat(cluster, 1)
        waiting = threading.Thread(target=dog.wait_for_the_others,
                                   daemon=True)
        waiting.start()
        # Worker 1 beat, and is neither done nor silent for GONE_SECS.
        waiting.join(1)
        assert waiting.is_alive()
        done(cluster, 1)
        waiting.join(10)
        assert not waiting.is_alive()


def test_wait_for_the_others_reads_again_after_a_read_that_timed_out(
        shared_cluster, monkeypatch):
    # A busy ps answers one read past RUN_OPTIONS' timeout: the chief goes
    # on waiting, and takes its last checkpoint only once the others are
    # done.
    cluster = shared_cluster(1, 2)
    start_ps(cluster, 0)
    with watchdog(cluster, 0) as dog:
        beat(cluster, 1)
        read, slow = dog._run, [True]

        def once_slow(fetches, session=None):
            if fetches is dog.beats and slow:
                slow.pop()
                return None
            return read(fetches, session)
        monkeypatch.setattr(dog, '_run', once_slow)
        waiting = threading.Thread(target=dog.wait_for_the_others,
                                   daemon=True)
        waiting.start()
        waiting.join(1)
        assert waiting.is_alive() and not slow
        done(cluster, 1)
        waiting.join(10)
        assert not waiting.is_alive()


def test_wait_for_the_others_gives_up_on_a_silent_worker(shared_cluster,
                                                         monkeypatch):
    monkeypatch.setattr(liveness, 'GONE_SECS', 0.5)
    cluster = shared_cluster(1, 2)
    start_ps(cluster, 0)
    with watchdog(cluster, 0) as dog:
        waiting = threading.Thread(target=dog.wait_for_the_others,
                                   daemon=True)
        waiting.start()
        waiting.join(10)
        assert not waiting.is_alive()
