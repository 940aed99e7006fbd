"""A ps task's end of a run: it serves until every worker has come and
gone, and tells the workers why when it ends on purpose."""

import time

import numpy as np
import tensorflow.compat.v1 as tf

from ps_cluster import liveness, probes
from ps_cluster.deadlines import Deadline, poll

# A worker counts its startup timeout from when it reached the ps; the ps,
# from its own start, waits this much longer for a worker that never came,
# so that a worker waiting for a chief that never came names it itself.
STARTUP_GRACE_SECS = 5


class PsTask:
    """A ps task's part in liveness: the counters it holds, read where they
    lie, on its own server, with no RPC."""

    def __init__(self, server, place):
        self.place = place
        self.workers = place.cluster.job_tasks('worker')
        with tf.Graph().as_default():
            [self.beats], [departures], [farewell], [self.reasons] = (
                liveness.counters(len(self.workers), [place.index]))
            self.gone_now = tf.placeholder(tf.int64, [None])
            self.depart = tf.scatter_add(departures, self.gone_now,
                                         tf.ones_like(self.gone_now))
            self.reason = tf.placeholder(tf.string, [])
            self.farewell, self.say = farewell, farewell.assign(self.reason)
            self.sess = tf.Session(server.target, config=tf.ConfigProto(
                device_filters=[place.name]))
            self.sess.run(tf.variables_initializer(
                [self.beats, departures, farewell, self.reasons]))

    def tell_workers(self, why, secs):
        """Says why this ps ends on purpose, until every worker has ended
        or not beaten for a second (it read it), or `secs` are nearly
        over."""
        self.sess.run(self.say, {self.reason: why})
        last, moved = self.sess.run(self.beats), time.monotonic()

        def read():
            nonlocal last, moved
            values = self.sess.run(self.beats)
            if np.any((values != last) & (values >= 0)):
                last, moved = values, time.monotonic()
            return (np.all(values < 0) or time.monotonic() - moved
                    > 2 * liveness.Watchdog.POLL_SECS)
        poll(read, secs - 1, 0.1)

    def preempted(self, secs):
        """Says that a scheduler preempted this ps (SIGTERM), so that the
        workers hold their updates and wait for it, and waits, up to a
        second before secs, for the chief to say what it saved; returns the
        ps's line."""
        self.sess.run(self.say, {self.reason: liveness.PREEMPTED})
        word = poll(lambda: self.sess.run(self.farewell).decode().replace(
            liveness.PREEMPTED, '', 1), secs - 1, 0.1)
        return liveness.PREEMPTED + (word or (
            '; the chief did not save the model within %g s '
            '(--preemption_grace): its updates since the last checkpoint '
            'are lost' % secs))

    def serve_until_workers_gone(self, startup_timeout, worker_timeout):
        """Serves until every worker has come up and ended, or is silent for
        worker_timeout; instead of server.join(), which never returns.
        Returns the workers that left on purpose, at start-up or later, and
        why: a list of (index, reason). A worker that never beats raises
        TaskFailed after startup_timeout. Ps 0 counts departures for the
        workers to read.
        """
        sess, workers = self.sess, self.workers
        deadline = Deadline(startup_timeout, '--startup_timeout',
                            STARTUP_GRACE_SECS)
        last = np.zeros(len(workers), np.int64)
        heard = np.full(len(workers), np.nan)  # when each counter last moved
        gone = np.zeros(len(workers), bool)
        polled = time.monotonic()
        while True:
            time.sleep(0.2)
            values, now = sess.run(self.beats), time.monotonic()
            if now - polled > 2:
                # This ps was stopped or starved: the silence is its own.
                heard[~np.isnan(heard)] = now
            polled = now
            moved = values != last
            heard[moved], gone[moved], last = now, False, values
            ended = values < 0
            silent = now - heard  # nan: never heard
            newly_gone = ~gone & (liveness.has_left(values) |
                                  (~ended & (silent > liveness.GONE_SECS)))
            if newly_gone.any():
                gone |= newly_gone
                sess.run(self.depart,
                         {self.gone_now: np.flatnonzero(newly_gone)})
            if np.all(ended | (silent > worker_timeout)):
                if not np.all(ended):
                    print('%s: every worker has ended or fell silent: %s '
                          'not heard for %g s (--worker_timeout)' % (
                              self.place.name, ', '.join(
                                  self.place.task('worker', i)
                                  for i in np.flatnonzero(~ended)),
                              worker_timeout), flush=True)
                left = np.flatnonzero(liveness.has_left(values))
                return [(int(i), reason.decode()) for i, reason in
                        zip(left, sess.run(self.reasons)[left])]
            probes.fail_if_late('worker', workers,
                                set(np.flatnonzero(np.isnan(heard))),
                                deadline)
