"""Which tasks of the cluster are up, alive or done, and what each task does
about it.

At start-up a worker waits for the ps tasks' ports, and for the chief's
model, each within --startup_timeout. From then on no task connects to
another's port to learn whether it lives: every worker beats, adding one to
its own slot of a counter vector on each ps task, over the gRPC channels that
training keeps open to the ps tasks anyway, once every POLL_SECS. Each ps
reads its own vector where it lies, decides who is alive, gone or done, and
leaves once every worker has come and gone; it also counts each worker's
departures, and the workers read ps 0's count to learn that another worker
is gone. A worker's cost is one small RPC to each ps task per poll, beside
the stall watchdog's read of the global step, whatever the number of
workers.

A task that ends on purpose says why: a worker marks its slot of the beats
(-1 done, -2 left on an error of its own or Ctrl-C); a ps writes its
reason where every worker reads it with its beat, and waits until they
have. A task that falls silent is waited for: by the ps for
--worker_timeout, by a worker for --ps_timeout.

The counters live in a graph of their own, so the Supervisor neither saves,
initializes nor waits for them.

The session a worker trains in, which outlives a lost ps, is
training_session.py's.
"""

import socket
import time

import grpc
import numpy as np
import tensorflow.compat.v1 as tf

import cluster_utils
from cluster_utils import FLAGS

# A worker whose counter has not moved for this long is gone: ten missed
# beats, so that a busy machine is not taken for a dead worker.
GONE_SECS = 5
# A worker counts its --startup_timeout from when it reached the ps; the ps,
# from its own start, waits this much longer for a worker that never came,
# so that a worker waiting for a chief that never came names it itself.
STARTUP_GRACE_SECS = 5
# The marks of a worker's beats that end it: done, or left on purpose.
DONE, LEFT = -1, -2


def counters(num_workers, ps_tasks):
    """The counters of each of ps_tasks (their indices): `beats`, one per
    worker, which DONE or LEFT ends; `departures`, how many times each
    worker was found gone; and `farewell`, why the ps ends on purpose."""
    beats, departures, farewells = [], [], []
    for k in ps_tasks:
        with tf.device('/job:ps/task:%d' % k):
            beats.append(tf.Variable(tf.zeros([num_workers], tf.int64),
                                     name='liveness/beats_%d' % k))
            departures.append(tf.Variable(tf.zeros([num_workers], tf.int64),
                                          name='liveness/departures_%d' % k))
            farewells.append(tf.Variable('', name='liveness/farewell_%d' % k))
    return beats, departures, farewells


# --------------------------------------------- waiting for the other tasks

def answers(address, timeout=2.0):
    """Whether the TensorFlow server at address answers a call within
    timeout: a frozen process still accepts connections, so an open port is
    not enough. Not a session run: one of those can block past its own
    timeout on a frozen ps. GetStatus's request is an empty message."""
    with grpc.insecure_channel(address) as channel:
        get_status = channel.unary_unary(
            '/tensorflow.WorkerService/GetStatus',
            request_serializer=lambda _: b'', response_deserializer=len)
        try:
            get_status(None, timeout=timeout)
            return True
        except grpc.RpcError:
            return False


def is_listening(address, timeout=1.0):
    host, _, port = address.rpartition(':')
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return True
    except OSError:
        return False


def wait_for_tasks(cluster, job):
    """Blocks until every task of `job` accepts connections: it is up, if
    perhaps not yet serving (answers() then tells)."""
    deadline = time.time() + FLAGS.startup_timeout
    addresses = cluster.job_tasks(job)
    missing = set(range(len(addresses)))
    while missing:
        missing = {i for i in missing if not is_listening(addresses[i])}
        fail_if_late(job, addresses, missing, deadline)
        if missing:
            time.sleep(0.2)


def fail_if_late(job, addresses, missing, deadline):
    """Ends this task, naming the first of the missing tasks of `job`, once
    the deadline has passed."""
    if missing and time.time() > deadline:
        i = min(missing)
        cluster_utils.fail('/job:%s/task:%d (%s) did not come up within %g s'
                           % (job, i, addresses[i], FLAGS.startup_timeout))


# ------------------------------------------------------ a worker's beats

class Watchdog(tf.train.LooperThread):
    """A thread of the Supervisor's that beats for this worker, and watches
    the other workers, the ps tasks and the global step through the ps
    tasks.

    While this worker waits for the model: a chief that came up and went
    away ends it. While it trains: a worker that went away is named once, if
    on_worker_gone(sess) says it is gone rather than done, and each new
    global step is told to on_step(step), the stall watch's. A ps that ends
    on purpose, and says why, ends this worker, quoting it. A beat that
    finds a ps lost stops the Supervisor's threads with the error. When the
    Supervisor stops, it closes the session and marks this worker done, and
    the Supervisor joins it; on a lost ps it calls on_ps_lost(sess) instead,
    each poll, until `paused`: the main thread waits for a lost ps, or
    closes. While paused it only beats.
    """

    POLL_SECS = 0.5
    # A run of the Watchdog's waits for a frozen ps ten polls at most.
    RUN_OPTIONS = tf.RunOptions(timeout_in_ms=int(POLL_SECS * 10000))

    def __init__(self, sv, server, cluster, on_worker_gone, on_ps_lost,
                 on_step):
        super().__init__(sv.coord, self.POLL_SECS)
        self.sv = sv
        self.on_worker_gone, self.on_ps_lost = on_worker_gone, on_ps_lost
        self.on_step = on_step
        self.workers = cluster.job_tasks('worker')
        self.ps_tasks = cluster.job_tasks('ps')
        self.sess, self.paused = None, False
        me = FLAGS.task_index
        graph = tf.Graph()
        with graph.as_default():
            beats, departures, self.farewells = counters(
                len(self.workers), range(len(self.ps_tasks)))

            def mark(value):
                value = tf.constant([value], tf.int64)
                return tf.group(*[tf.scatter_update(b, [me], value)
                                  for b in beats])
            one = tf.constant([1], tf.int64)
            self.beat_op = tf.group(*[tf.scatter_add(b, [me], one)
                                      for b in beats])
            self.done_op, self.left_op = mark(DONE), mark(LEFT)
            self.beats, self.departures = beats[0], departures[0]
            # Summed where it lies: a scalar a poll, not a vector.
            with tf.device(self.departures.device):
                self.departed = tf.reduce_sum(self.departures)
        self.session = tf.Session(
            server.target, graph=graph,
            config=cluster_utils.session_config(cluster))
        self.last_departures = self._first_beat()
        self.start()

    def watch_training(self, sess):
        self.sess = sess

    def _first_beat(self):
        """Beats once before this worker waits for the model, so that the
        ps tasks know it from then on; they may not have set up their
        counters yet."""
        deadline = time.time() + FLAGS.startup_timeout
        while True:
            try:
                self.session.run(self.beat_op)
                return self.session.run(self.departures)
            except tf.errors.FailedPreconditionError:
                if time.time() > deadline:
                    cluster_utils.fail('the ps tasks did not set up their '
                                       'liveness counters within %g s'
                                       % FLAGS.startup_timeout)
                time.sleep(0.2)

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
        try:
            _, departed, farewells = self.session.run(
                [self.beat_op, self.departed, self.farewells],
                options=self.RUN_OPTIONS)
        except (tf.errors.UnavailableError, tf.errors.AbortedError) as e:
            # A lost ps: the Supervisor's threads stop with it, and the
            # main thread recovers, freed by on_ps_lost if it waits.
            if not self.paused:
                self.sv.coord.request_stop(e)
            return
        except (tf.errors.OpError, RuntimeError):  # a frozen ps
            return
        for k, reason in enumerate(farewells):
            if reason:
                cluster_utils.die(
                    'error: lost the connection to /job:ps/task:%d (%s), '
                    'which ended: "%s"' % (k, self.ps_tasks[k],
                                           reason.decode()))
        if self.paused:
            return
        if departed != self.last_departures.sum():
            self._someone_departed()
        if self.sess is not None:
            step = self._run(self.sv.global_step, self.sess)
            if step is not None:
                self.on_step(step)

    def stop_loop(self):
        try:
            self.sv.coord.raise_requested_exception()
        except (tf.errors.UnavailableError, tf.errors.AbortedError):
            # A lost ps: the main thread may wait on a ps that stayed, for
            # what the stopped threads were to give it. Closing the session
            # would not free it: that waits on the lost ps. Each poll again
            # until the main thread is out: the call may meet the broken
            # connection, and another worker may take what it gives.
            while self.on_ps_lost and self.sess is not None \
                    and not self.paused:
                self._call(self.on_ps_lost)
                time.sleep(self.POLL_SECS)
            return
        except Exception:  # a thread failed: the main thread says why
            return
        # Done only once the session is closed: closing still needs the ps
        # tasks, which may leave once every worker is done.
        self.sess.close()
        self._run(self.done_op)

    def say_left(self):
        """Marks this worker as gone on purpose, on every ps task."""
        self._run(self.left_op)

    def _someone_departed(self):
        departures = self._run(self.departures)
        if departures is None:
            return
        for i in np.flatnonzero(departures > self.last_departures):
            if i == FLAGS.task_index:
                continue
            if self.sess is None and i == 0:
                cluster_utils.die('error: the chief, /job:worker/task:0 (%s), '
                                  'went away before the model was ready'
                                  % self.workers[0])
            if self.sess is not None and self._is_gone():
                print('worker=%d: %s is gone; training goes on without it'
                      % (FLAGS.task_index, self._task(i)), flush=True)
        self.last_departures = departures

    def silent_workers(self):
        """The other workers whose counters do not move over a second, not
        counting those that ended."""
        before = self._run(self.beats)
        time.sleep(1)
        after = self._run(self.beats)
        if before is None or after is None:
            return []
        return [self._task(i) for i in np.flatnonzero(
            (before == after) & (after >= 0)) if i != FLAGS.task_index]

    def _is_gone(self):
        return self.on_worker_gone is not None and self._call(
            self.on_worker_gone)

    def _call(self, hook):
        """hook(the training session), or False where a ps cannot answer
        or the session is closing."""
        try:
            return hook(self.sess)
        except (tf.errors.OpError, RuntimeError):
            return False

    def _task(self, i):
        return '/job:worker/task:%d (%s)' % (i, self.workers[i])


# ------------------------------------------------------ a ps's end of a run

def serve_until_workers_gone(server, cluster):
    """The ps side of the end of a run: serve until every worker has come up
    and ended, or is silent for --worker_timeout.

    Instead of server.join(), which never returns. It reads the counters
    where they lie, on this ps, with no RPC, and ps 0 counts departures for
    the workers to read. A worker that never beats ends the ps after
    --startup_timeout; a ps that ends on purpose tells the workers why.
    """
    workers = cluster.job_tasks('worker')
    me = '/job:ps/task:%d' % FLAGS.task_index
    with tf.Graph().as_default():
        [beats], [departures], [farewell] = counters(len(workers),
                                                     [FLAGS.task_index])
        gone_now = tf.placeholder(tf.int64, [None])
        depart = tf.scatter_add(departures, gone_now,
                                tf.ones_like(gone_now))
        reason = tf.placeholder(tf.string, [])
        say = farewell.assign(reason)
        sess = tf.Session(server.target, config=tf.ConfigProto(
            device_filters=[me]))
        sess.run(tf.variables_initializer([beats, departures, farewell]))

    def tell_workers(why):
        """Until every worker has read why and left, or is silent."""
        sess.run(say, {reason: why})
        _wait_for_farewells(sess, beats)
    cluster_utils.before_leaving(tell_workers)

    deadline = time.time() + FLAGS.startup_timeout + STARTUP_GRACE_SECS
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
        newly_gone = ~gone & ((values == LEFT) |
                              (~ended & (silent > GONE_SECS)))
        if newly_gone.any():
            gone |= newly_gone
            sess.run(depart, {gone_now: np.flatnonzero(newly_gone)})
        if np.all(ended | (silent > FLAGS.worker_timeout)):
            return
        fail_if_late('worker', workers, set(np.flatnonzero(np.isnan(heard))),
                     deadline)


def _wait_for_farewells(sess, beats):
    """Waits until every worker has ended or not beaten for a second, the
    farewell read, or LAST_WORDS_SECS are nearly over."""
    deadline = time.time() + cluster_utils.LAST_WORDS_SECS - 1
    last, moved = sess.run(beats), time.time()
    while time.time() < deadline:
        time.sleep(0.1)
        values = sess.run(beats)
        if np.any((values != last) & (values >= 0)):
            last, moved = values, time.time()
        if np.all(values < 0) or time.time() - moved > 2 * Watchdog.POLL_SECS:
            return
