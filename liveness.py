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

The counters live in a graph of their own, so the Supervisor neither saves,
initializes nor waits for them.

A worker that loses a ps task probes its port again until it is back,
within --ps_timeout, and trains on in a new session (RecoverableSession).
"""

import socket
import threading
import time

import numpy as np
import tensorflow.compat.v1 as tf

import cluster_utils
from cluster_utils import FLAGS

# A worker whose counter has not moved for this long is gone: ten missed
# beats, so that a busy machine is not taken for a dead worker.
GONE_SECS = 5
# A ps leaves a run only once every worker is done or this long silent: it
# cannot come back, so it waits longer than a notice of a worker gone.
LEAVE_SECS = 15


def counters(num_workers, ps_tasks):
    """The counters of each of ps_tasks (their indices): `beats`, one per
    worker, which -1 marks done; and `departures`, how many times each
    worker was found gone."""
    beats, departures = [], []
    for k in ps_tasks:
        with tf.device('/job:ps/task:%d' % k):
            beats.append(tf.Variable(tf.zeros([num_workers], tf.int64),
                                     name='liveness/beats_%d' % k))
            departures.append(tf.Variable(tf.zeros([num_workers], tf.int64),
                                          name='liveness/departures_%d' % k))
    return beats, departures


# --------------------------------------------- waiting for the other tasks

def is_listening(address, timeout=1.0):
    host, _, port = address.rpartition(':')
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return True
    except OSError:
        return False


def wait_for_tasks(cluster, job):
    """Blocks until every task of `job` accepts connections."""
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


# ------------------------------------------- the session a worker trains in

class RecoverableSession:
    """The session a worker trains in: the Supervisor's, once the ps tasks
    and the chief are up, with a Watchdog on the other workers; and again,
    as at start-up, after a ps task was lost and came back.

    Only the main thread runs in it. When a run, or a thread of the
    Supervisor's, loses a ps task, run() waits up to --ps_timeout for every
    ps task to answer at its address again, stops the Supervisor's threads,
    and opens a new session: the chief joins the model if the ps tasks still
    hold it (a ps that never left), else restores it from the last
    checkpoint in --logdir (a restarted ps holds none), or initializes it
    again; the others wait for it. Then the failed run is run again.
    A thread may find the ps lost first, while the main thread waits on a
    ps that stayed for what the stopped threads were to give it (the sync
    workers' token): on_ps_lost(session), called by each worker once per
    lost session, frees it, and its next run recovers.

    The chief saves checkpoints every --save_checkpoint_secs, in a loop of
    the Supervisor's that outlives a failed save (the Supervisor's own would
    stop every thread of the chief). It says where the model came from:
    initialized, restored from the last checkpoint in --logdir, or joined
    live on the ps, where workers kept training while it was away (newer
    than any checkpoint, and what Supervisor would otherwise initialize
    again under them).
    """

    # How long the Supervisor's threads may take to stop, before the worker
    # goes on without them.
    STOP_SECS = 10

    def __init__(self, sv, server, cluster, on_worker_gone=None,
                 on_ps_lost=None):
        self.sv, self.server, self.cluster = sv, server, cluster
        self.on_worker_gone, self.on_ps_lost = on_worker_gone, on_ps_lost
        self.starts = []
        wait_for_tasks(cluster, 'ps')
        with cluster_utils.exit_if_cluster_lost(cluster):
            self._open()

    def run(self, fetches, feed_dict=None):
        return self._recovering(lambda session: session.run(fetches,
                                                            feed_dict))

    def on_each_session(self, start):
        """Calls start(session) now, and in each new session: for threads of
        the Supervisor's that run in it, such as the sync chief's updates."""
        self._recovering(start)
        self.starts.append(start)

    def close(self):
        """Ends this worker's session and the Supervisor's threads, and
        marks this worker done.

        The threads are told to stop first; the Watchdog, one of them, then
        closes the session, which cancels what the others are blocked in,
        such as the sync chief's wait for gradients that no worker will send
        any more, and marks this worker done; only then can they be joined.
        """
        if self.sv.save_path:  # the chief, with a --logdir: a last one
            cluster_utils.save_checkpoint(self.sv, self.session)
        self.sv.request_stop()
        self.sv.stop(close_summary_writer=False)
        if self.sv.summary_writer:
            try:
                self.sv.summary_writer.close()
            except RuntimeError:  # its thread failed, and said so
                pass

    def _recovering(self, call):
        while True:
            try:
                error = self._thread_error()
                if error:
                    raise error
                return call(self.session)
            except (tf.errors.UnavailableError, tf.errors.AbortedError) as e:
                self._recover(e)

    def _thread_error(self):
        """The lost ps task that a thread of the Supervisor's stopped on."""
        if not self.sv.coord.should_stop():
            return None
        try:
            self.sv.coord.raise_requested_exception()
        except (tf.errors.UnavailableError, tf.errors.AbortedError) as e:
            return e
        except Exception:  # not a lost ps: not the main thread's to answer
            return None

    def _recover(self, error):
        """Waits for every ps task to answer, and opens a new session; or,
        after --ps_timeout, ends this worker naming the ps task it lost."""
        self.watchdog.paused = True
        self.sv.coord.request_stop(error)  # the Watchdog calls on_ps_lost
        deadline = time.time() + FLAGS.ps_timeout
        addresses = self.cluster.job_tasks('ps')
        missing = {i for i, address in enumerate(addresses)
                   if not is_listening(address)}
        print('worker=%d: %s; waiting up to %g s for it' % (
            FLAGS.task_index,
            cluster_utils.lost_connection(self.cluster, error, missing),
            FLAGS.ps_timeout), flush=True)
        while True:
            missing = {i for i in missing if not is_listening(addresses[i])}
            if not missing:
                try:
                    self._stop_threads(error)
                    self._open(again=True)
                    step = self.session.run(self.sv.global_step)
                    print('worker=%d: resuming at global_step=%d'
                          % (FLAGS.task_index, step), flush=True)
                    for start in self.starts:
                        start(self.session)
                    return
                except (tf.errors.UnavailableError,
                        tf.errors.AbortedError) as e:
                    error = e
            if time.time() > deadline:
                cluster_utils.die('error: ' + cluster_utils.lost_connection(
                    self.cluster, error, missing))
            time.sleep(0.5)

    def _stop_threads(self, error):
        """Stops the Supervisor's threads, the Watchdog among them, with the
        error, so that it neither closes the session nor marks this worker
        done."""
        self.sv.coord.request_stop(error)
        self.watchdog.join(self.STOP_SECS)  # on_ps_lost runs in the session
        # Closing cancels what they wait for; it may wait on a lost ps.
        threading.Thread(target=self.session.close, daemon=True).start()
        try:
            self.sv.coord.join(stop_grace_period_secs=self.STOP_SECS,
                               ignore_live_threads=True)
        except Exception:  # the error they stopped on
            pass
        self.sv.coord.clear_stop()

    def _open(self, again=False):
        sv, server, cluster = self.sv, self.server, self.cluster
        with cluster_utils.exit_if_misplaced(cluster):
            self.watchdog = Watchdog(sv, server, cluster, self.on_worker_gone,
                                     self.on_ps_lost)
            if sv.is_chief and model_is_live(sv, server, cluster):
                sess = sv.session_manager.prepare_session(
                    server.target,
                    config=cluster_utils.session_config(cluster))
                sv.start_standard_services(sess)
                print('worker=0: joined the live model on the ps at '
                      'global_step=%d' % sess.run(sv.global_step), flush=True)
            else:
                sess = _prepare_or_wait(sv, server, cluster, again)
        if sv.save_path:  # the chief, with a --logdir
            sv.loop(FLAGS.save_checkpoint_secs, cluster_utils.save_checkpoint,
                    args=(sv, sess))
        self.watchdog.watch_training(sess)
        self.session = sess


def model_is_live(sv, server, cluster):
    """Whether the ps tasks hold every shared variable initialized already.

    Supervisor's ready_op names the uninitialized variables, this worker's
    own local ones among them."""
    with tf.Session(server.target,
                    config=cluster_utils.session_config(cluster)) as probe:
        uninitialized = {name.decode() for name in probe.run(sv.ready_op)}
    return not uninitialized & {v.op.name for v in tf.global_variables()}


def _prepare_or_wait(sv, server, cluster, again):
    """The chief initializes or restores the model, and says which; the
    others wait for it."""
    checkpoint = (sv.is_chief and FLAGS.logdir
                  and tf.train.latest_checkpoint(FLAGS.logdir))
    try:
        sess = sv.prepare_or_wait_for_session(
            server.target, config=cluster_utils.session_config(cluster),
            max_wait_secs=FLAGS.startup_timeout)
    except tf.errors.DeadlineExceededError:
        cluster_utils.fail(
            'the chief, /job:worker/task:0 (%s), did not initialize the '
            'model within %g s' % (cluster.task_address('worker', 0),
                                   FLAGS.startup_timeout))
    except (tf.errors.DataLossError, tf.errors.InvalidArgumentError,
            tf.errors.NotFoundError) as e:
        if not checkpoint:
            raise
        cluster_utils.fail('cannot restore the checkpoint %s (%s): move it '
                           'away, or choose another --logdir'
                           % (checkpoint, cluster_utils.what_went_wrong(e)))
    if checkpoint:
        print('worker=0: restored the model from %s' % checkpoint, flush=True)
    elif sv.is_chief and again:
        print('worker=0: initialized the model again: %s' % (
            'no checkpoint in --logdir yet' if FLAGS.logdir
            else 'without --logdir there is no checkpoint to restore'),
            flush=True)
    elif sv.is_chief:
        print('worker=0: initialized the model', flush=True)
    return sess


# ------------------------------------------------------ a worker's beats

class Watchdog(tf.train.LooperThread):
    """A thread of the Supervisor's that beats for this worker, and watches
    the other workers and the global step through the ps tasks.

    While this worker waits for the model: a chief that came up and went
    away ends it. While it trains: a worker that went away is named once, if
    on_worker_gone(sess) says it is gone rather than done, and a global step
    that has not moved for --stall_timeout seconds ends it, naming the
    workers that do not beat. A beat that finds a ps lost stops the
    Supervisor's threads with the error. When the Supervisor stops, it
    closes the session and marks this worker done, and the Supervisor joins
    it; on a lost ps it calls on_ps_lost(sess) instead. While `paused` (the
    main thread waits for a lost ps) it only beats.
    """

    POLL_SECS = 0.5
    # A run of the Watchdog's waits for a frozen ps ten polls at most.
    RUN_OPTIONS = tf.RunOptions(timeout_in_ms=int(POLL_SECS * 10000))

    def __init__(self, sv, server, cluster, on_worker_gone, on_ps_lost):
        super().__init__(sv.coord, self.POLL_SECS)
        self.sv = sv
        self.on_worker_gone, self.on_ps_lost = on_worker_gone, on_ps_lost
        self.workers = cluster.job_tasks('worker')
        self.sess, self.paused = None, False
        self.last_step, self.last_move = None, None
        me = FLAGS.task_index
        graph = tf.Graph()
        with graph.as_default():
            beats, departures = counters(len(self.workers),
                                         range(cluster.num_tasks('ps')))
            one, done = tf.constant([1], tf.int64), tf.constant([-1], tf.int64)
            self.beat_op = tf.group(*[tf.scatter_add(b, [me], one)
                                      for b in beats])
            self.done_op = tf.group(*[tf.scatter_update(b, [me], done)
                                      for b in beats])
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
            beat = self.session.run([self.beat_op, self.departed],
                                    options=self.RUN_OPTIONS)
        except (tf.errors.UnavailableError, tf.errors.AbortedError) as e:
            # A lost ps: the Supervisor's threads stop with it, and the
            # main thread recovers, freed by on_ps_lost if it waits.
            if not self.paused:
                self.sv.coord.request_stop(e)
            return
        except (tf.errors.OpError, RuntimeError):  # a frozen ps
            beat = None
        if self.paused:
            return
        if beat is not None and beat[1] != self.last_departures.sum():
            self._someone_departed()
        if self.sess is not None:
            self._check_global_step()

    def stop_loop(self):
        try:
            self.sv.coord.raise_requested_exception()
        except (tf.errors.UnavailableError, tf.errors.AbortedError):
            # A lost ps: the main thread may wait on a ps that stayed, for
            # what the stopped threads were to give it. Closing the session
            # would not free it: that waits on the lost ps.
            if self.on_ps_lost and self.sess is not None:
                self._call(self.on_ps_lost)
            return
        except Exception:  # a thread failed: the main thread says why
            return
        # Done only once the session is closed: closing still needs the ps
        # tasks, which may leave once every worker is done.
        self.sess.close()
        self._run(self.done_op)

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

    def _check_global_step(self):
        step = self._run(self.sv.global_step, self.sess)
        if self.last_move is None or step != self.last_step:
            self.last_step, self.last_move = step, time.time()
        elif time.time() - self.last_move > FLAGS.stall_timeout:
            cluster_utils.die(
                'error: training stalled: no new global step for %g s; '
                'missing: %s' % (FLAGS.stall_timeout, ', '.join(
                    map(self._task, self._silent())) or 'none'))

    def _silent(self):
        """The other workers whose counters do not move over a second, not
        counting those done."""
        before = self._run(self.beats)
        time.sleep(1)
        after = self._run(self.beats)
        if before is None or after is None:
            return []
        return [i for i in np.flatnonzero((before == after) & (after != -1))
                if i != FLAGS.task_index]

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
    and is done, or silent for LEAVE_SECS.

    Instead of server.join(), which never returns. It reads the counters
    where they lie, on this ps, with no RPC, and ps 0 counts departures for
    the workers to read. A worker that never beats ends the ps after
    --startup_timeout.
    """
    workers = cluster.job_tasks('worker')
    me = '/job:ps/task:%d' % FLAGS.task_index
    with tf.Graph().as_default():
        [beats], [departures] = counters(len(workers), [FLAGS.task_index])
        gone_now = tf.placeholder(tf.int64, [None])
        depart = tf.scatter_add(departures, gone_now,
                                tf.ones_like(gone_now))
        sess = tf.Session(server.target, config=tf.ConfigProto(
            device_filters=[me]))
        sess.run(tf.variables_initializer([beats, departures]))
    deadline = time.time() + FLAGS.startup_timeout
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
        done = values == -1
        silent = now - heard  # nan: never heard
        newly_gone = ~done & ~gone & (silent > GONE_SECS)
        if newly_gone.any():
            gone |= newly_gone
            sess.run(depart, {gone_now: np.flatnonzero(newly_gone)})
        if np.all(done | (silent > LEAVE_SECS)):
            return
        fail_if_late('worker', workers, set(np.flatnonzero(np.isnan(heard))),
                     deadline)
