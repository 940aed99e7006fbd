"""Which tasks of the cluster are alive, from the workers' heartbeats: each
worker adds one to its own slot of a counter vector on each ps task, over
the channels that training keeps open anyway (over its own while those
carry nothing), every POLL_SECS; each ps reads its own where it lies and
counts departures (ps_task.py); workers read ps 0's count and each ps's
farewell. A worker's cost is one small RPC to each ps task a poll,
whatever the number of workers.

A worker that ends marks its slot DONE, or LEFT with its reason, at
start-up too. The counters live in a graph of their own, so the Supervisor
neither saves, initializes nor waits for them.
"""

import contextlib
import threading
import time

import numpy as np
import tensorflow.compat.v1 as tf

from ps_cluster import errors, probes, server
from ps_cluster.deadlines import call_within, poll
from ps_cluster.exits import TaskFailed

# The marks of a worker's beats that end it: done, or left on purpose. Each
# lies far below zero, LEFT below DONE: a beat already on its way when a
# worker marks its slot adds one to the mark, which must still read the
# same.
DONE, LEFT = -2**20, -2**40
# A worker whose counter has not moved for this long is gone: ten missed
# beats, so that a busy machine is not taken for a dead worker.
GONE_SECS = 5
# A ps's farewell when a scheduler preempts it (SIGTERM): it leaves once the
# chief has saved the model, and comes back.
PREEMPTED = 'preempted'


class Preempted(tf.errors.UnavailableError):
    """A ps task's farewell that it was preempted, which the workers wait
    for as for a lost ps, once the chief has saved the model: "TASK was
    preempted"."""


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

    def variable(value, name):
        # The same kind in every process, however far it has set TensorFlow
        # up: a worker tells why it ends from its first checks on.
        return tf.Variable(value, name=name, use_resource=False)
    for k in ps_tasks:
        with tf.device('/job:ps/task:%d' % k):
            beats.append(variable(tf.zeros([num_workers], tf.int64),
                                  'liveness/beats_%d' % k))
            departures.append(variable(tf.zeros([num_workers], tf.int64),
                                       'liveness/departures_%d' % k))
            farewells.append(variable('', 'liveness/farewell_%d' % k))
            reasons.append(variable(tf.fill([num_workers], ''),
                                    'liveness/reasons_%d' % k))
    return beats, departures, farewells, reasons


class Slot:
    """A worker's own slot on the ps tasks as its process marks it: its
    first beat and LEFT one at a time, LEFT for good: a worker told to
    leave (SIGTERM, from the signals' thread) as its first beat is on its
    way must read LEFT after both."""

    def __init__(self):
        self.lock = threading.Lock()
        self.left = False


def say_left(cluster, task_index, reason, secs=0, slot=None):
    """Marks worker task_index LEFT, with its reason, on each ps task that
    answers, trying again for secs those not up yet, in sessions of its
    own: from a worker that has no server or Watchdog yet too; `slot`, its
    Slot, if it has one."""
    def mark(beats, departures, farewell, reasons):
        # The reason first: LEFT is what the others act on.
        with tf.control_dependencies([tf.scatter_update(
                reasons, [task_index], [reason])]):
            return tf.scatter_update(beats, [task_index],
                                     tf.constant([LEFT], tf.int64))
    slot = slot or Slot()
    # A first beat that waits on a frozen ps holds the slot: tell anyway.
    held = slot.lock.acquire(timeout=1)
    try:
        slot.left = True
        probes.tell_each(
            {k: cluster.task_address('ps', k)
             for k in range(cluster.num_tasks('ps'))},
            lambda k: _run_on_ps(cluster, k, mark) is not None, secs)
    finally:
        if held:
            slot.lock.release()


@contextlib.contextmanager
def beating(cluster, task_index):
    """Worker task_index beats on each ps task that answers, from a thread
    of its own, while the block runs: a recovery's, whose lost ps stopped
    the Watchdog's beats, and the ps tasks that stayed would count this
    worker gone. Each beat in sessions of its own; a frozen ps is passed
    over. The thread is joined as the block ends, within the deadlines of
    a beat under way; what made it fail is raised then, unless the block
    raises its own."""
    coord = tf.train.Coordinator()
    thread = tf.train.LooperThread(coord, Watchdog.POLL_SECS, beat_alone,
                                   (cluster, task_index))
    thread.start()
    ended = False
    try:
        yield
        ended = True
    finally:
        coord.request_stop()
        try:
            # A beat's one-call session on each ps: three steps each.
            coord.join([thread], stop_grace_period_secs=3 * server.CALL_SECS
                       * cluster.num_tasks('ps'), ignore_live_threads=True)
        except Exception:
            if ended:
                raise


def beat_alone(cluster, task_index):
    """Worker task_index's beat on each ps task that answers, each in a
    session of its own, over a connection of its own. Returns what a
    Watchdog reads with its beats: each ps's farewell (None where one does
    not answer), and the departures counted on ps 0 (None likewise)."""
    def beat_op(beats, departures, farewell, _):
        beat = tf.scatter_add(beats, [task_index], tf.constant([1], tf.int64))
        return [beat, farewell, tf.reduce_sum(departures)]
    farewells, departed = [], None
    for k, address in enumerate(cluster.job_tasks('ps')):
        read = (_run_on_ps(cluster, k, beat_op)
                if probes.answers(address, Watchdog.POLL_SECS) else None)
        farewells.append(read and read[1])
        if k == 0 and read:
            departed = read[2]
    return farewells, departed


def read_alone(cluster, variable):
    """The value of `variable`, a variable of the training graph that lies
    on a ps task (/job:ps/task:K), read there in a session of its own, over
    a connection of its own; None if the ps does not answer (a frozen one
    is passed over, as a beat passes it over)."""
    where = tf.DeviceSpec.from_string(variable.device)
    address = cluster.task_address('ps', where.task)
    if not probes.answers(address, Watchdog.POLL_SECS):
        return None
    with tf.Graph().as_default() as graph, tf.device(variable.device):
        # The same variable, by its name, where it lies.
        value = tf.Variable(
            tf.zeros(variable.shape, variable.dtype.base_dtype),
            name=variable.op.name,
            use_resource=variable.op.type == 'VarHandleOp').value()
    return server.call_once(address, '/job:ps/task:%d' % where.task, graph,
                            value)


def say_saved(cluster, word):
    """The chief's word on what it saved for a preemption, told to each ps
    task that says it was preempted, in its farewell: the ps quotes it as
    it goes."""
    for k in range(cluster.num_tasks('ps')):
        _run_on_ps(cluster, k, lambda beats, departures, farewell, reasons:
                   farewell.assign(tf.where(
                       tf.equal(farewell, PREEMPTED),
                       '%s; the chief %s' % (PREEMPTED, word), farewell)))


def farewells(cluster):
    """Each ps task's farewell: PREEMPTED while it waits for the chief's
    save, then with the chief's word after it; '' where it says nothing
    (one started again) or does not answer."""
    return [(_run_on_ps(cluster, k, lambda *counters: counters[2]) or b''
             ).decode() for k in range(cluster.num_tasks('ps'))]


def silent_workers(place, came_only=False):
    """The workers other than place's whose beats on ps 0 stand still over
    a second, not counting those that ended (nor, came_only, those that
    never beat: an elastic run waits for none of them), as the lines name
    them; None if ps 0 does not answer."""
    def beats(beats, *_):
        return beats
    before = _run_on_ps(place.cluster, 0, beats)
    time.sleep(1)
    after = _run_on_ps(place.cluster, 0, beats)
    if before is None or after is None:
        return None
    return [place.task('worker', i) for i in np.flatnonzero(
        (before == after) & (after >= int(came_only))) if i != place.index]


def _run_on_ps(cluster, k, fetches):
    """fetches(beats, departures, farewell, reasons) of ps task k's
    counters, run in a session of its own; None if they are not set up
    yet, or the ps does not answer."""
    with tf.Graph().as_default() as graph:
        ops = fetches(*[c for [c] in counters(cluster.num_tasks('worker'),
                                              [k])])
    return server.call_once(cluster.task_address('ps', k),
                            '/job:ps/task:%d' % k, graph, ops)


# ------------------------------------------------------ a worker's beats

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

    # A beat each; the recovery's attempts too. Ten missed make GONE_SECS.
    POLL_SECS = 0.5
    # A run of the Watchdog's waits for a frozen ps ten polls at most.
    RUN_OPTIONS = tf.RunOptions(timeout_in_ms=int(POLL_SECS * 10000))
    # A beat's wait while its beats go over connections of their own.
    ALONE_OPTIONS = tf.RunOptions(timeout_in_ms=int(POLL_SECS * 1000))

    def __init__(self, coord, global_step, server, config, place, watch,
                 deadline, tokens=None, slot=None):
        super().__init__(coord, self.POLL_SECS)
        self.coord, self.global_step, self.place = coord, global_step, place
        self.watch, self.tokens, self.slot = watch, tokens, slot or Slot()
        # The training session: set before the thread reads it, and closed,
        # not replaced: a new session has a Watchdog of its own.
        self.sess = None
        # Whether its beats go over connections of their own (run_loop()).
        self.alone = False
        graph = tf.Graph()
        with graph.as_default():
            beats, departures, self.farewells, reasons = counters(
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
                on_each_ps(tf.scatter_update, DONE))
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
                call_within(self.POLL_SECS * 10, self.session.close)
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
                if np.all(((beats < 0) | (now - heard > GONE_SECS))[others]):
                    return
            time.sleep(self.POLL_SECS)

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
        return reason.decode() if has_left(beat) else None

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
            farewells, departed = beat_alone(self.place.cluster,
                                             self.place.index)
        for k, reason in enumerate(farewells):
            if reason is None:  # a ps that does not answer, read alone
                continue
            if reason.decode().startswith(PREEMPTED):
                self.coord.request_stop((Preempted, Preempted(
                    None, None, self.place.task('ps', k) + ' was preempted'),
                    None))
                return
            if reason:
                raise TaskFailed('lost the connection to %s, which ended: '
                                 '"%s"' % (self.place.task('ps', k),
                                           reason.decode()))
        if departed is not None and departed != self.last_departures.sum():
            self._someone_departed()
        if self.sess is not None:
            step = (read_alone(self.place.cluster, self.global_step)
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
                time.sleep(self.POLL_SECS)

    def _someone_departed(self):
        departures = (_run_on_ps(self.place.cluster, 0,
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
