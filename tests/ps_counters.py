"""For the in-process tests: what a worker writes to and reads from a ps's
liveness counters, each in a session of its own."""

import contextlib
import threading
import time

import tensorflow.compat.v1 as tf

from ps_cluster import liveness, sources
from ps_cluster.ps.ps_task import PsTask
import small_model


@contextlib.contextmanager
def counters_on_ps(cluster, index):
    """(session, [beats, departures, farewell, reasons]) of ps `index`'s
    counters, in a graph and session of their own."""
    with tf.Graph().as_default():
        counters = [c for [c] in liveness.counters(
            cluster.num_tasks('worker'), [index])]
        with tf.Session('grpc://' + cluster.task_address('ps', index),
                        config=tf.ConfigProto(device_filters=[
                            '/job:ps/task:%d' % index])) as sess:
            yield sess, counters


def on_ps(cluster, index, fetches):
    """fetches(beats, departures, farewell, reasons), of ps `index`'s
    counters, run in a session of its own."""
    with counters_on_ps(cluster, index) as (sess, counters):
        return sess.run(fetches(*counters))


def beat(cluster, index):
    """Worker `index` beats once, on ps 0."""
    on_ps(cluster, 0, lambda beats, *_: tf.scatter_add(
        beats, [index], tf.constant([1], tf.int64)))


def done(cluster, index):
    """Worker `index` ends, as its Watchdog's mark_done() marks it."""
    on_ps(cluster, 0, lambda beats, *_: tf.scatter_update(
        beats, [index], tf.constant([liveness.DONE], tf.int64)))


@contextlib.contextmanager
def beating(cluster, index):
    """Worker `index` beats on ps 0 every 0.1 s while the block runs, in
    one session: a beat is a run, as a Watchdog's, not a new session."""
    stop = threading.Event()

    def beat_until_stopped():
        with counters_on_ps(cluster, 0) as (sess, (beats, *_)):
            beat_op = tf.scatter_add(beats, [index],
                                     tf.constant([1], tf.int64))
            while not stop.is_set():
                sess.run(beat_op)
                time.sleep(0.1)

    thread = threading.Thread(target=beat_until_stopped, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def start(cluster, job, index):
    return small_model.server(cluster, job, index)


def start_ps(cluster, index):
    """Ps `index`'s server, its counters set up as the ps task sets them
    up."""
    return PsTask(start(cluster, 'ps', index),
                  sources.Place(cluster, 'ps', index))


def beats_and_reasons(cluster, index):
    return on_ps(cluster, index, lambda beats, _, __, reasons: [
        beats, reasons])
