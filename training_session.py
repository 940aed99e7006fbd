"""The session a worker trains in, and how it outlives a lost ps task.

A worker opens it once the ps tasks answer (liveness.wait_for_tasks): the
chief initializes the model, restores it from the last checkpoint in
--logdir, or joins it live on the ps; the others wait for it. A worker that
loses a ps task calls it again until it answers, within --ps_timeout, and
trains on in a new session opened the same way. Training that makes no step
for --stall_timeout, or for --ps_timeout while a ps does not answer, ends
the worker whatever it waits in (stall_watch.py).
"""

import contextlib
import re
import threading
import time

import tensorflow.compat.v1 as tf
from tensorflow.python.framework import error_interpolation

import cluster_utils
import liveness
import stall_watch
from cluster_utils import FLAGS


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
        self.watchdog = self.stall = None
        parse_errors_in_linear_time()
        # Ending on purpose, this worker tells the ps tasks it left.
        cluster_utils.before_leaving(
            lambda _: self.watchdog and self.watchdog.say_left())
        liveness.wait_for_tasks(cluster, 'ps')
        with cluster_utils.exit_if_cluster_lost(cluster), \
                self._ending_if_ps_away(FLAGS.startup_timeout):
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
        with self.stall.waiting_in('the end of the session'):
            if self.sv.save_path:  # the chief, with a --logdir: a last one
                cluster_utils.save_checkpoint(self.sv, self.session)
            self.watchdog.paused = True  # no training run left to free
            self.sv.request_stop()
            self.sv.stop(close_summary_writer=False)
            if self.sv.summary_writer:
                try:
                    self.sv.summary_writer.close()
                except RuntimeError:  # its thread failed, and said so
                    pass
        self.stall.stop()

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
        print('worker=%d: %s; waiting up to %g s for it' % (
            FLAGS.task_index, cluster_utils.lost_connection(
                self.cluster, error, self._missing_ps()),
            FLAGS.ps_timeout), flush=True)
        with self._ending_if_ps_away(FLAGS.ps_timeout, error), \
                self.stall.waiting_in('the wait for a lost ps',
                                      watch_ps=False):
            while True:
                missing = self._missing_ps()
                if not missing:
                    try:
                        self._reopen(error)
                        return
                    except (tf.errors.UnavailableError,
                            tf.errors.AbortedError) as e:
                        error = e
                if time.time() > deadline:
                    self._give_up(error, missing)
                time.sleep(0.5)

    def _missing_ps(self):
        """The ps tasks that do not answer at their address."""
        return {i for i, address in enumerate(self.cluster.job_tasks('ps'))
                if not liveness.answers(address)}

    def _silent_ps(self):
        return ['/job:ps/task:%d (%s)' % (i, self.cluster.task_address('ps', i))
                for i in sorted(self._missing_ps())]

    def _on_step(self, step):
        if self.stall:
            self.stall.step(step)

    @contextlib.contextmanager
    def _ending_if_ps_away(self, secs, error=None):
        """Ends this worker, naming the lost ps task, if a ps task does not
        answer at a deadline, every `secs`, until the block is done."""
        # Opening a session waits in TensorFlow, with no timeout, for a ps
        # that went away after a probe found it listening.
        done = threading.Event()

        def end_if_ps_away():
            while not done.wait(secs):
                missing = self._missing_ps()
                if missing and not done.is_set():
                    self._give_up(error, missing)

        threading.Thread(target=end_if_ps_away, daemon=True).start()
        try:
            yield
        finally:
            done.set()

    def _give_up(self, error, missing):
        cluster_utils.die('error: ' + cluster_utils.lost_connection(
            self.cluster, error, missing))

    def _reopen(self, error):
        self._stop_threads(error)
        self._open(again=True)
        step = self.session.run(self.sv.global_step)
        print('worker=%d: resuming at global_step=%d'
              % (FLAGS.task_index, step), flush=True)
        for start in self.starts:
            start(self.session)

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
            self.watchdog = liveness.Watchdog(
                sv, server, cluster, self.on_worker_gone, self.on_ps_lost,
                self._on_step)
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
        if self.stall is None:  # from the first training session on
            self.stall = stall_watch.StallWatch(
                FLAGS.stall_timeout, FLAGS.ps_timeout, self._silent_ps,
                lambda: self.watchdog.silent_workers())


def parse_errors_in_linear_time():
    """TensorFlow 2.x parses the message of every error of a session run
    for node tags with a regex whose time grows faster than the square of
    the message's length (40,000 characters: 15 s), holding the GIL: a
    worker whose run failed after a ps restart hung for good in it, and no
    thread of its own could end it. The same parse, one tag at a time.
    A TensorFlow whose module differs (1.15's) is left alone."""
    tag_pattern = re.compile(getattr(error_interpolation, '_TAG_REGEX', ''))
    if {'type', 'name'} - set(tag_pattern.groupindex) or not hasattr(
            error_interpolation, '_ParseTag'):
        return
    parse_tag = error_interpolation._ParseTag

    def parse_message(message):
        kept, func_tags, node_tags, pos = [], [], [], 0
        for match in tag_pattern.finditer(message):
            tag = parse_tag(match.group('type'), match.group('name'))
            if tag.type == 'function_node':  # dropped from the message
                kept.append(message[pos:match.start()])
                func_tags.append(tag)
            else:
                kept.append(message[pos:match.end()])
                node_tags.append(tag)
            pos = match.end()
        kept.append(message[pos:])
        return ''.join(kept), func_tags, node_tags

    error_interpolation.parse_message = parse_message


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
