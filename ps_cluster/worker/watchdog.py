"""A worker's Watchdog: the thread of its training session that beats for
it on the ps tasks (liveness.py's counters) and reads through them what the
other tasks do."""

import contextlib
import time

import numpy as np
import tensorflow.compat.v1 as tf

from ps_cluster import errors, liveness, probes
from ps_cluster.deadlines import call_within, poll
from ps_cluster.exits import TaskFailed


class Watchdog(tf.train.LooperThread):
    """A thread of a session's (`coord`, its Coordinator) that beats for
    this worker, and reads through the ps tasks what the other tasks do. It
    raises, and so stores in coord, a ps that ended on purpose, and stores
    a lost ps, which the main thread recovers from; it tells `watch` (a
    StallWatch) the global step once this worker trains in `sess`.
    A worker gone is named once if sync's `tokens` say it is not done;
    after a lost ps, a sync worker's Watchdog puts in tokens until the main
    thread recovers. `slot`: this worker's Slot.
    """

    # A run of the Watchdog's waits for a frozen ps ten polls at most.
    RUN_OPTIONS = tf.RunOptions(timeout_in_ms=int(liveness.POLL_SECS * 10000))
    # A beat's wait while its beats go over connections of their own.
    ALONE_OPTIONS = tf.RunOptions(timeout_in_ms=int(liveness.POLL_SECS * 1000))

    def __init__(self, coord, global_step, server, config, place, watch,
                 deadline, tokens=None, slot=None):
        super().__init__(coord, liveness.POLL_SECS)
        self.coord, self.global_step, self.place = coord, global_step, place
        self.watch, self.tokens = watch, tokens
        self.slot = slot or liveness.Slot()
        # The training session: set before the thread reads it, and closed,
        # not replaced: a new session has a Watchdog of its own.
        self.sess = None
        # Whether its beats go over connections of their own (run_loop()).
        self.alone = False
        graph = tf.Graph()
        with graph.as_default():
            beats, departures, self.farewells, reasons = liveness.counters(
                place.cluster.num_tasks('worker'),
                range(place.cluster.num_tasks('ps')))

            def on_each_ps(scatter, value):
                return tf.group(*[scatter(b, [place.index], tf.constant(
                    [value], tf.int64)) for b in beats])
            # A worker that comes, again too, counts anew (come_op): its
            # slot may say LEFT or DONE of a life before, which would count
            # it gone.
            self.beat_op, self.come_op, self.done_op = (
                on_each_ps(tf.scatter_add, 1),
                on_each_ps(tf.scatter_update, 1),
                on_each_ps(tf.scatter_update, liveness.DONE))
            self.beats, self.departures = beats[0], departures[0]
            # The chief's slot and reason, read where they lie.
            with tf.device(reasons[0].device):
                self.chief = [beats[0][0], reasons[0][0]]
            # Summed where it lies: a scalar a poll, not a vector.
            with tf.device(self.departures.device):
                self.departed = tf.reduce_sum(self.departures)
        # Its own, closed by its creator once the thread has stopped.
        self.session = tf.Session(server.target, graph=graph, config=config)

        # Once before this worker waits for the model, so that the ps tasks
        # know it from then on; they may not have set up their counters
        # yet.
        def first_beat():
            try:
                with self.watch.calling('the first beat',
                                        deadline=deadline):
                    with self.slot.lock:
                        if not self.slot.left:
                            self.session.run(self.come_op)
                    return [self.session.run(self.departures)]
            except tf.errors.FailedPreconditionError:
                return None
        try:
            departures = poll(first_beat, deadline.left(), 0.2)
            if departures is None:
                raise TaskFailed('the ps tasks did not set up their liveness '
                                 'counters %s' % deadline)
            self.last_departures = departures[0]
        except BaseException:
            # Closed where it was opened, but not waited for on a lost ps.
            with contextlib.suppress(Exception):
                call_within(liveness.POLL_SECS * 10, self.session.close)
            raise
        self.start()

    def mark_done(self):
        self._run(self.done_op)

    def wait_for_the_others(self):
        """Until every other worker has ended, or is gone (no beat for
        GONE_SECS), or a ps is lost: the chief's last checkpoint then holds
        the run's last step. The main thread's: it raises a failure stored,
        but a lost ps's."""
        heard, last = None, None
        while True:
            failure = errors.stored(self.coord)
            if errors.is_lost(failure):
                return
            if failure is not None:
                raise failure
            with self.watch.calling('the wait for the other workers'):
                beats, now = self._run(self.beats), time.monotonic()
            # A read that failed, of a ps that answers: again, a poll later.
            if beats is None and not probes.answers(
                    self.place.cluster.task_address('ps', 0)):
                return
            if beats is not None:
                if last is None:
                    heard, last = np.full(len(beats), now), beats
                heard[beats != last], last = now, beats
                others = np.arange(len(beats)) != self.place.index
                gone = now - heard > liveness.GONE_SECS
                if np.all(((beats < 0) | gone)[others]):
                    return
            time.sleep(liveness.POLL_SECS)

    def _run(self, fetches, session=None):
        """fetches, run in the liveness session or the given one, or None
        where a ps cannot answer (the beat says so) or the session is
        closing."""
        try:
            return (session or self.session).run(fetches,
                                                 options=self.RUN_OPTIONS)
        except (tf.errors.OpError, RuntimeError):
            return None

    def chief_left(self):
        """Why the chief left on purpose, if its slot says it did: a worker
        that waits for its model then waits in vain."""
        beat, reason = self._run(self.chief) or (0, b'')
        return reason.decode() if liveness.has_left(beat) else None

    def run_loop(self):
        try:
            _, departed, farewells = self.session.run(
                [self.beat_op, self.departed, self.farewells],
                options=self.ALONE_OPTIONS if self.alone else self.RUN_OPTIONS)
            self.alone = False
        except (tf.errors.OpError, RuntimeError) as e:
            # A lost ps: stored, and the main thread recovers (stop_loop()
            # runs, unlike after a raise).
            if errors.is_lost(e):
                self.coord.request_stop(e)
            if not isinstance(e, tf.errors.DeadlineExceededError):
                return
            # A beat past its deadline: a frozen ps, passed over; this
            # worker's connection stuck after a network cut healed, which
            # may carry no call for minutes; or its own ops' pool held by a
            # run (a straggler's wait): the ps tasks would count it gone.
            # Each poll, until a beat gets through in a short wait on this
            # connection (a healthy one answers in milliseconds), it beats
            # and reads the same over connections of its own.
            self.alone = True
            farewells, departed = liveness.beat_alone(self.place.cluster,
                                             self.place.index)
        for k, reason in enumerate(farewells):
            if reason is None:  # a ps that does not answer, read alone
                continue
            if reason.decode().startswith(liveness.PREEMPTED):
                preempted = liveness.Preempted(
                    None, None, self.place.task('ps', k) + ' was preempted')
                self.coord.request_stop((liveness.Preempted, preempted, None))
                return
            if reason:
                raise TaskFailed('lost the connection to %s, which ended: '
                                 '"%s"' % (self.place.task('ps', k),
                                           reason.decode()))
        if departed is not None and departed != self.last_departures.sum():
            self._someone_departed()
        if self.sess is not None:
            step = (liveness.read_alone(self.place.cluster, self.global_step)
                    if self.alone else self._run(self.global_step, self.sess))
            if step is not None:
                self.watch.step(step)

    def stop_loop(self):
        # A lost ps: a sync worker's run may wait, on a ps that stayed, for
        # a token that the stopped updates were to give. One each poll (a
        # put may meet the broken connection, another worker take it),
        # until the main thread closes the session to recover.
        if (self.tokens and self.sess is not None
                and errors.is_lost(errors.stored(self.coord))):
            while True:
                try:
                    self.sess.run(self.tokens.add_token_op,
                                  options=self.RUN_OPTIONS)
                except tf.errors.OpError:
                    pass
                except RuntimeError:  # closed
                    return
                time.sleep(liveness.POLL_SECS)

    def _someone_departed(self):
        departures = (liveness.run_on_ps(self.place.cluster, 0,
                                 lambda beats, departures, *_: departures)
                      if self.alone else self._run(self.departures))
        if departures is None:
            return
        for i in np.flatnonzero(departures > self.last_departures):
            # Named once sync's tokens say it is gone; async's workers wait
            # for nobody, and are not told. A ps may not answer.
            with contextlib.suppress(tf.errors.OpError, RuntimeError):
                if (i != self.place.index and self.tokens and self.sess
                        is not None and self.tokens.on_departure(self.sess)):
                    print('worker=%d: %s is gone; training goes on without '
                          'it' % (self.place.index,
                                  self.place.task('worker', i)), flush=True)
        self.last_departures = departures
