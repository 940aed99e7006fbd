"""A ps task's end of a run: it serves until every worker has come and
gone, and tells the workers why when it ends on purpose."""

import time

import numpy as np
import tensorflow.compat.v1 as tf

from ps_cluster import liveness, probes
from ps_cluster.deadlines import Deadline, poll
from ps_cluster.exits import TaskFailed
from ps_cluster.probes import STARTUP_GRACE_SECS
from ps_cluster.settings import MIN_WORKERS


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
                    > 2 * liveness.POLL_SECS)
        poll(read, secs - 1, 0.1)

    def preempted(self, grace):
        """Says that a scheduler preempted this ps (SIGTERM), so that the
        workers hold their updates and wait for it, and waits, up to a
        second before `grace` (a Limit) is over, for the chief to say what
        it saved; returns the ps's line."""
        self.sess.run(self.say, {self.reason: liveness.PREEMPTED})
        word = poll(lambda: self.sess.run(self.farewell).decode().replace(
            liveness.PREEMPTED, '', 1), grace.secs - 1, 0.1)
        return liveness.PREEMPTED + (word or (
            '; the chief did not save the model within %s: its updates '
            'since the last checkpoint are lost' % (grace,)))

    def serve_until_workers_gone(self, startup_timeout, worker_timeout,
                                 min_workers=None):
        """Serves until every worker has come up and ended, or is silent for
        worker_timeout (a Limit, as startup_timeout); instead of
        server.join(), which never returns.
        Returns the workers that left on purpose, at start-up or later, and
        why: a list of (index, reason). A worker that never beats raises
        TaskFailed after startup_timeout. Ps 0 counts departures for the
        workers to read. With min_workers below the workers listed, the run
        is elastic: a worker that has not come is not waited for once the
        chief has ended, and fewer than min_workers here (come, and not
        gone) for startup_timeout raise TaskFailed.
        """
        sess, workers = self.sess, self.workers
        elastic = min_workers is not None and min_workers < len(workers)
        deadline = Deadline(startup_timeout, STARTUP_GRACE_SECS)
        last = np.zeros(len(workers), np.int64)
        heard = np.full(len(workers), np.nan)  # when each counter last moved
        gone = np.zeros(len(workers), bool)
        polled = enough = time.monotonic()
        while True:
            time.sleep(0.2)
            values, now = sess.run(self.beats), time.monotonic()
            if now - polled > 2:
                # This ps was stopped or starved: the silence is its own.
                heard[~np.isnan(heard)] = now
                enough += now - polled
            polled = now
            moved = values != last
            heard[moved], gone[moved], last = now, False, values
            ended, came = values < 0, ~np.isnan(heard)
            silent = now - heard  # nan: never heard
            newly_gone = ~gone & (liveness.has_left(values) |
                                  (~ended & (silent > liveness.GONE_SECS)))
            if newly_gone.any():
                gone |= newly_gone
                sess.run(self.depart,
                         {self.gone_now: np.flatnonzero(newly_gone)})
            waited = came if elastic else np.full(len(workers), True)
            over = ended | (silent > worker_timeout.secs)
            # Elastic: the chief too has ended, or fell silent.
            if np.all(over | ~waited) and (over[0] or not elastic):
                # The workers that fell silent, and in an elastic run how
                # many came and left, in a line each.
                if not np.all(ended | ~came):
                    print('%s: every worker has ended or fell silent: %s not '
                          'heard for %s' % (
                              self.place.name, ', '.join(
                                  self.place.task('worker', i)
                                  for i in np.flatnonzero(~ended & came)),
                              worker_timeout), flush=True)
                if elastic:
                    print('%s: every worker that came has ended: %d of the '
                          '%d listed came, %d left' % (
                              self.place.name, np.sum(came), len(came),
                              np.sum(liveness.has_left(values))), flush=True)
                left = np.flatnonzero(liveness.has_left(values))
                return [(int(i), reason.decode()) for i, reason in
                        zip(left, sess.run(self.reasons)[left])]
            if not elastic:
                probes.fail_if_late('worker', workers,
                                    set(np.flatnonzero(~came)), deadline)
            elif np.sum(came & ~gone) >= min_workers:
                enough = now
            elif now - enough > deadline.limit.secs + STARTUP_GRACE_SECS:
                raise TaskFailed(
                    'fewer than %d workers (%s) for %s: %d of the %d '
                    'listed here' % (min_workers, MIN_WORKERS,
                                     startup_timeout, np.sum(came & ~gone),
                       len(workers)))
