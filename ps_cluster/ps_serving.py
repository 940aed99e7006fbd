"""A ps task's end of a run: it serves until every worker has come and
gone, and tells the workers why when it ends on purpose."""

import time

import numpy as np
import tensorflow.compat.v1 as tf

from ps_cluster import liveness, probes

# A worker counts its startup timeout from when it reached the ps; the ps,
# from its own start, waits this much longer for a worker that never came,
# so that a worker waiting for a chief that never came names it itself.
STARTUP_GRACE_SECS = 5


def serve_until_workers_gone(server, cluster, index, end, startup_timeout,
                             worker_timeout):
    """Serves until every worker has come up and ended, or is silent for
    worker_timeout; instead of server.join(), which never returns. Returns
    the workers that left on purpose, at start-up or later, and why: a list
    of (index, reason).

    It reads the counters where they lie, on this ps, with no RPC, and ps 0
    counts departures for the workers to read. A worker that never beats
    ends the ps after startup_timeout; a ps that ends on purpose tells the
    workers why.
    """
    workers = cluster.job_tasks('worker')
    with tf.Graph().as_default():
        [beats], [departures], [farewell], [reasons] = liveness.counters(
            len(workers), [index])
        gone_now = tf.placeholder(tf.int64, [None])
        depart = tf.scatter_add(departures, gone_now,
                                tf.ones_like(gone_now))
        reason = tf.placeholder(tf.string, [])
        say = farewell.assign(reason)
        sess = tf.Session(server.target, config=tf.ConfigProto(
            device_filters=['/job:ps/task:%d' % index]))
        sess.run(tf.variables_initializer([beats, departures, farewell,
                                           reasons]))

    def tell_workers(why):
        """Until every worker has read why and left, or is silent."""
        sess.run(say, {reason: why})
        _wait_for_farewells(sess, beats, end.LAST_WORDS_SECS)
    end.before_leaving(tell_workers)

    deadline = time.time() + startup_timeout + STARTUP_GRACE_SECS
    last = np.zeros(len(workers), np.int64)
    heard = np.full(len(workers), np.nan)  # when each counter last moved
    gone = np.zeros(len(workers), bool)
    polled = time.time()
    while True:
        time.sleep(0.2)
        values, now = sess.run(beats), time.time()
        if now - polled > 2:
            # This ps was stopped or starved: the silence is its own.
            heard[~np.isnan(heard)] = now
        polled = now
        moved = values != last
        heard[moved], gone[moved], last = now, False, values
        ended = values < 0
        silent = now - heard  # nan: never heard
        newly_gone = ~gone & ((values == liveness.LEFT) |
                              (~ended & (silent > liveness.GONE_SECS)))
        if newly_gone.any():
            gone |= newly_gone
            sess.run(depart, {gone_now: np.flatnonzero(newly_gone)})
        if np.all(ended | (silent > worker_timeout)):
            left = np.flatnonzero(values == liveness.LEFT)
            return [(i, reason.decode())
                    for i, reason in zip(left, sess.run(reasons)[left])]
        probes.fail_if_late('worker', workers,
                            set(np.flatnonzero(np.isnan(heard))), deadline,
                            startup_timeout, end)


def _wait_for_farewells(sess, beats, secs):
    """Waits until every worker has ended or not beaten for a second, the
    farewell read, or `secs` are nearly over."""
    deadline = time.time() + secs - 1
    last, moved = sess.run(beats), time.time()
    while time.time() < deadline:
        time.sleep(0.1)
        values = sess.run(beats)
        if np.any((values != last) & (values >= 0)):
            last, moved = values, time.time()
        if (np.all(values < 0)
                or time.time() - moved > 2 * liveness.Watchdog.POLL_SECS):
            return
