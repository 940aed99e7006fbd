"""Which tasks of the cluster are alive, from the workers' heartbeats: each
worker adds one to its own slot of a counter vector on each ps task, over
the channels that training keeps open anyway (over its own while those
carry nothing), every POLL_SECS; each ps reads its own where it lies and
counts departures (ps/ps_task.py); workers read ps 0's count and each ps's
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

from ps_cluster import probes, server

# The marks of a worker's beats that end it: done, or left on purpose. Each
# lies far below zero, LEFT below DONE: a beat already on its way when a
# worker marks its slot adds one to the mark, which must still read the
# same.
DONE, LEFT = -2**20, -2**40
# A beat each; a worker's recovery tries as often. Ten missed make
# GONE_SECS.
POLL_SECS = 0.5
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
            lambda k: run_on_ps(cluster, k, mark) is not None, secs)
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
    thread = tf.train.LooperThread(coord, POLL_SECS, beat_alone,
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
        read = (run_on_ps(cluster, k, beat_op)
                if probes.answers(address, POLL_SECS) else None)
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
    if not probes.answers(address, POLL_SECS):
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
        run_on_ps(cluster, k, lambda beats, departures, farewell, reasons:
                   farewell.assign(tf.where(
                       tf.equal(farewell, PREEMPTED),
                       '%s; the chief %s' % (PREEMPTED, word), farewell)))


def farewells(cluster):
    """Each ps task's farewell: PREEMPTED while it waits for the chief's
    save, then with the chief's word after it; '' where it says nothing
    (one started again) or does not answer."""
    return [(run_on_ps(cluster, k, lambda *counters: counters[2]) or b''
             ).decode() for k in range(cluster.num_tasks('ps'))]


def silent_workers(place, came_only=False):
    """The workers other than place's whose beats on ps 0 stand still over
    a second, not counting those that ended (nor, came_only, those that
    never beat: an elastic run waits for none of them), as the lines name
    them; None if ps 0 does not answer."""
    def beats(beats, *_):
        return beats
    before = run_on_ps(place.cluster, 0, beats)
    time.sleep(1)
    after = run_on_ps(place.cluster, 0, beats)
    if before is None or after is None:
        return None
    return [place.task('worker', i) for i in np.flatnonzero(
        (before == after) & (after >= int(came_only))) if i != place.index]


def run_on_ps(cluster, k, fetches):
    """fetches(beats, departures, farewell, reasons) of ps task k's
    counters, run in a session of its own; None if they are not set up
    yet, or the ps does not answer."""
    with tf.Graph().as_default() as graph:
        ops = fetches(*[c for [c] in counters(cluster.num_tasks('worker'),
                                              [k])])
    return server.call_once(cluster.task_address('ps', k),
                            '/job:ps/task:%d' % k, graph, ops)
