"""For the in-process tests: what a worker writes to and reads from a ps's
liveness counters, each in a session of its own."""

import contextlib
import threading
import time

import tensorflow.compat.v1 as tf

from ps_cluster import liveness


def on_ps(cluster, index, fetches):
    """fetches(beats, departures, farewell, reasons), of ps `index`'s
    counters, run in a session of its own."""
    with tf.Graph().as_default():
        counters = [c for [c] in liveness.counters(
            cluster.num_tasks('worker'), [index])]
        with tf.Session('grpc://' + cluster.task_address('ps', index),
                        config=tf.ConfigProto(device_filters=[
                            '/job:ps/task:%d' % index])) as sess:
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
    """Worker `index` beats every 0.1 s while the block runs."""
    stop = threading.Event()

    def beats():
        while not stop.is_set():
            beat(cluster, index)
            time.sleep(0.1)

    thread = threading.Thread(target=beats, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
