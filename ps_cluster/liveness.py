"""Which tasks of the cluster are alive, from the workers' heartbeats: each
worker adds one to its own slot of a counter vector on each ps task, over
the channels that training keeps open anyway, every POLL_SECS; each ps
reads its own where it lies and counts departures (ps_task.py); workers
read ps 0's count and each ps's farewell. A worker's cost is one small RPC
to each ps task a poll, whatever the number of workers.

A worker that ends marks its slot DONE, or LEFT with its reason, at
start-up too. The counters live in a graph of their own, so the Supervisor
neither saves, initializes nor waits for them.
"""

import threading
import time

import numpy as np
import tensorflow.compat.v1 as tf

from ps_cluster import errors, probes
from ps_cluster.deadlines import poll
from ps_cluster.exits import TaskFailed

# The marks of a worker's beats that end it: done, or left on purpose. LEFT
# lies far below: a beat already on its way when a failing worker marks its
# slot adds one to the mark, which must still read LEFT.
DONE, LEFT = -1, -2**40
# A worker whose counter has not moved for this long is gone: ten missed
# beats, so that a busy machine is not taken for a dead worker.
GONE_SECS = 5


def has_left(beats):
    """Which of `beats` (numbers or a tensor) say their worker left on
    purpose, a late beat or two after it did."""
    return beats <= LEFT // 2


def counters(num_workers, ps_tasks):
    """The counters of each of ps_tasks (their indices): `beats`, one per
    worker, which DONE or LEFT ends; `departures`, how many times each
    worker was found gone; `farewell`, why the ps ends on purpose; and
    `reasons`, why each worker that LEFT did."""
    beats, departures, farewells, reasons = [], [], [], []
    for k in ps_tasks:
        with tf.device('/job:ps/task:%d' % k):
            beats.append(tf.Variable(tf.zeros([num_workers], tf.int64),
                                     name='liveness/beats_%d' % k))
            departures.append(tf.Variable(tf.zeros([num_workers], tf.int64),
                                          name='liveness/departures_%d' % k))
            farewells.append(tf.Variable('', name='liveness/farewell_%d' % k))
            reasons.append(tf.Variable(tf.fill([num_workers], ''),
                                       name='liveness/reasons_%d' % k))
    return beats, departures, farewells, reasons


def say_left(cluster, task_index, reason, secs=0):
    """Marks worker task_index LEFT, with its reason, on each ps task that
    answers, trying again for secs those not up yet, in sessions of its
    own: from a worker that has no server or Watchdog yet too."""
    untold = list(enumerate(cluster.job_tasks('ps')))

    def tell_those_up():
        for k, address in list(untold):
            # Opening a session waits with no timeout for a ps not there.
            if probes.is_listening(address) and _mark_left(
                    address, k, cluster.num_tasks('worker'), task_index,
                    reason):
                untold.remove((k, address))
        return not untold
    poll(tell_those_up, secs, 0.2)


def _mark_left(address, k, num_workers, task_index, reason):
    """Whether ps task k, at address, took the mark: its counters may not
    be set up yet."""
    with tf.Graph().as_default() as graph:
        [beats], _, _, [reasons] = counters(num_workers, [k])
        # The reason first: LEFT is what the others act on.
        with tf.control_dependencies([tf.scatter_update(
                reasons, [task_index], [reason])]):
            mark = tf.scatter_update(beats, [task_index],
                                     tf.constant([LEFT], tf.int64))
    try:
        with tf.Session('grpc://' + address, graph=graph,
                        config=tf.ConfigProto(device_filters=[
                            '/job:ps/task:%d' % k])) as sess:
            sess.run(mark, options=Watchdog.RUN_OPTIONS)
        return True
    except tf.errors.OpError:  # not set up yet, or not answering
        return False


def _left_before_the_model(beats, global_step):
    """Whether the chief's slot of `beats` says it left on purpose while
    `global_step` (the model's, named and placed as in the model's graph)
    is not initialized: it never will be."""
    with tf.device(beats.device):
        left = has_left(beats[0])
    with tf.device(global_step.device):
        # Of its kind: a ref and a resource variable of one name are two.
        step = tf.Variable(0, dtype=global_step.dtype.base_dtype,
                           name=global_step.op.name, trainable=False,
                           use_resource=global_step.op.type == 'VarHandleOp')
        ready = tf.is_variable_initialized(step)
    return tf.logical_and(left, tf.logical_not(ready))


# ------------------------------------------------------ a worker's beats

class Watchdog(tf.train.LooperThread):
    """A thread of the Supervisor's that beats for this worker, and reads
    through the ps tasks what the other tasks do. To `stall`, the
    StallWatch: a chief gone while this worker waits for the model, and a
    ps that ended on purpose, as failures; the global step, once it trains
    (watch_training). A worker gone is named once if sync's `tokens` say it
    is not done. A lost ps stops the Supervisor's threads with the error,
    for the main thread to recover; a sync worker's Watchdog then puts in
    tokens until it does: the main thread may wait, on a ps that stayed,
    for one the stopped updates were to give. Paused, it only beats.
    """

    POLL_SECS = 0.5
    # A run of the Watchdog's waits for a frozen ps ten polls at most.
    RUN_OPTIONS = tf.RunOptions(timeout_in_ms=int(POLL_SECS * 10000))

    def __init__(self, sv, server, config, place, startup_timeout, stall,
                 tokens=None):
        super().__init__(sv.coord, self.POLL_SECS)
        self.sv, self.place, self.stall, self.tokens = sv, place, stall, tokens
        task_index = place.index
        # The training session: set before the thread reads it, and closed,
        # not replaced: a new session has a Watchdog of its own.
        self.sess = None
        self._paused = threading.Event()
        graph = tf.Graph()
        with graph.as_default():
            beats, departures, self.farewells, reasons = counters(
                place.cluster.num_tasks('worker'),
                range(place.cluster.num_tasks('ps')))
            one = tf.constant([1], tf.int64)
            self.beat_op = tf.group(*[tf.scatter_add(b, [task_index], one)
                                      for b in beats])
            done = tf.constant([DONE], tf.int64)
            self.done_op = tf.group(*[tf.scatter_update(b, [task_index], done)
                                      for b in beats])
            self.beats, self.departures = beats[0], departures[0]
            with tf.device(reasons[0].device):
                self.chief_reason = reasons[0][0]
            # Summed where it lies: a scalar a poll, not a vector.
            with tf.device(self.departures.device):
                self.departed = tf.reduce_sum(self.departures)
            self.chief_left_early = _left_before_the_model(beats[0],
                                                           sv.global_step)
        self.session = tf.Session(server.target, graph=graph, config=config)
        self.last_departures = self._first_beat(startup_timeout)
        self.start()

    def watch_training(self, sess):
        """From now on, this worker trains in sess."""
        self.sess = sess

    def pause(self):
        """Only beats from now on: the main thread waits for a lost ps, or
        closes the session."""
        self._paused.set()

    def mark_done(self):
        self._run(self.done_op)

    def wait_for_the_others(self):
        """Until every other worker has ended, or is gone (no beat for
        GONE_SECS), or no ps answers: the chief's last checkpoint then holds
        the run's last step. The main thread's: it raises a failure
        stored."""
        heard, last = None, None
        while True:
            self.stall.raise_if_failed()
            beats, now = self._run(self.beats), time.time()
            if beats is None:
                return
            if last is None:
                heard, last = np.full(len(beats), now), beats
            heard[beats != last], last = now, beats
            others = np.arange(len(beats)) != self.place.index
            if np.all(((beats < 0) | (now - heard > GONE_SECS))[others]):
                return
            time.sleep(self.POLL_SECS)

    def silent_workers(self):
        """The other workers whose counters do not move over a second, not
        counting those that ended."""
        before = self._run(self.beats)
        time.sleep(1)
        after = self._run(self.beats)
        if before is None or after is None:
            return []
        return [self._task(i) for i in np.flatnonzero(
            (before == after) & (after >= 0)) if i != self.place.index]

    def _first_beat(self, timeout):
        """Beats once before this worker waits for the model, so that the
        ps tasks know it from then on; they may not have set up their
        counters yet."""
        def beat():
            try:
                self.session.run(self.beat_op)
                return [self.session.run(self.departures)]
            except tf.errors.FailedPreconditionError:
                return None
        departures = poll(beat, timeout, 0.2)
        if departures is None:
            raise TaskFailed('the ps tasks did not set up their liveness '
                             'counters within %g s' % timeout)
        return departures[0]

    def _run(self, fetches, session=None):
        """fetches, run in the liveness session or the given one, or None
        where a ps cannot answer (the beat says so) or the session is
        closing."""
        try:
            return (session or self.session).run(fetches,
                                                 options=self.RUN_OPTIONS)
        except (tf.errors.OpError, RuntimeError):
            return None

    def run_loop(self):
        # For the chief's model.
        waiting = self.sess is None and not self.place.is_chief
        try:
            _, departed, farewells, chief_left_early = self.session.run(
                [self.beat_op, self.departed, self.farewells,
                 self.chief_left_early if waiting else []],
                options=self.RUN_OPTIONS)
        except (tf.errors.OpError, RuntimeError) as e:
            # A lost ps: the Supervisor's threads stop with it, and the
            # main thread recovers; a frozen ps: nothing to do.
            if errors.is_lost(e) and not self._paused.is_set():
                self.sv.coord.request_stop(e)
            return
        for k, reason in enumerate(farewells):
            if reason:
                self.stall.fail(
                    'lost the connection to %s, which ended: "%s"'
                    % (self.place.task('ps', k), reason.decode()))
                return
        if self._paused.is_set():
            return
        # A chief that left before this worker's first beat counts no
        # departure that this worker sees.
        if waiting and chief_left_early:
            self._chief_went_away()
            return
        if departed != self.last_departures.sum():
            self._someone_departed()
        if self.sess is not None:
            step = self._run(self.sv.global_step, self.sess)
            if step is not None:
                self.stall.step(step)

    def stop_loop(self):
        try:
            self.sv.coord.raise_requested_exception()
        except Exception as e:  # any but a lost ps's: sv.stop() raises it
            if errors.is_lost(e) and self.tokens and self.sess is not None:
                # Each poll again: a put may meet the broken connection,
                # and another worker may take the token.
                while not self._paused.wait(self.POLL_SECS):
                    self._run(self.tokens.add_token_op, self.sess)

    def _someone_departed(self):
        departures = self._run(self.departures)
        if departures is None:
            return
        for i in np.flatnonzero(departures > self.last_departures):
            if i == self.place.index:
                continue
            if self.sess is None and i == 0:
                self._chief_went_away()
                return
            if self.sess is not None and self._is_gone():
                print('worker=%d: %s is gone; training goes on without it'
                      % (self.place.index, self._task(i)), flush=True)
        self.last_departures = departures

    def _chief_went_away(self):
        reason = self._run(self.chief_reason)
        self.stall.fail('the chief, %s, went away before the model was '
                        'ready%s' % (self._task(0), ': "%s"' % reason.decode()
                                     if reason else ''))

    def _is_gone(self):
        """Whether sync's tokens say a worker is gone; async's workers wait
        for nobody, and are not told."""
        if self.tokens is None:
            return False
        try:
            return self.tokens.on_departure(self.sess)
        except (tf.errors.OpError, RuntimeError):  # a ps cannot answer
            return False

    def _task(self, i):
        return self.place.task('worker', i)
