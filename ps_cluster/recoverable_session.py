"""The session a worker trains in, and how it outlives a lost ps task.

A worker opens it once the ps tasks answer (session_start.py says where the
model comes from). A worker that loses a ps task calls it again until it
answers, within its timeout, and trains on in a new session opened the same
way. Training that makes no step for a while ends the worker whatever it
waits in (stall_watch.py).
"""

import collections
import contextlib
import threading
import time

import tensorflow.compat.v1 as tf

from ps_cluster import errors, liveness, probes, session_start
from ps_cluster.exits import TaskFailed

# How long a worker waits: for the other tasks at start-up, for a lost ps
# to come back, and for a new global step.
Timeouts = collections.namedtuple('Timeouts', ['startup', 'ps', 'stall'])


class RecoverableSession:
    """The session a worker trains in: the Supervisor's, once the ps tasks
    and the chief are up, with a Watchdog on the other tasks; and again, as
    at start-up, after a ps task was lost and came back.

    Only the main thread runs in it. When a run, or a thread of the
    Supervisor's, loses a ps task, run() waits up to timeouts.ps for every ps
    task to answer at its address again, stops the Supervisor's threads, and
    opens a new session; then the failed run is run again. A thread may find
    the ps lost first, while the main thread waits on a ps that stayed for
    what the stopped threads were to give it (sync's token): this worker's
    `tokens` free it, and its next run recovers.

    The chief saves checkpoints in `logdir` (a Logdir) every
    logdir.save_checkpoint_secs, in a loop of the Supervisor's that outlives
    a failed save (the Supervisor's own would stop every thread of the
    chief).

    A failure raises TaskFailed in the main thread; one that another thread
    finds, while the main thread may wait in TensorFlow, ends the worker
    through `stall`, the StallWatch, which also ends a run that stalls.
    """

    # How long the Supervisor's threads may take to stop, before the worker
    # goes on without them.
    STOP_SECS = 10

    def __init__(self, sv, server, place, config, timeouts, stall,
                 logdir=None, tokens=None):
        self.sv, self.server, self.place = sv, server, place
        self.cluster, self.index = place.cluster, place.index
        self.config, self.timeouts, self.stall = config, timeouts, stall
        self.logdir, self.tokens = logdir, tokens
        self.starts = []
        self.watchdog = None
        # The main thread swaps the session; the token-freeing thread reads
        # it.
        self.session = None
        self._recovering = threading.Event()
        self._freeing = None  # a thread that frees the main thread
        probes.wait_for_tasks(self.cluster, 'ps', timeouts.startup)
        lost = errors.failing_if_cluster_lost(self.cluster,
                                              ('worker', self.index))
        with lost, self._ending_if_ps_away(timeouts.startup):
            self._open()
        stall.watch(self._silent_ps, lambda: self.watchdog.silent_workers())

    def run(self, fetches, feed_dict=None):
        return self._recovering_from_lost_ps(
            lambda session: session.run(fetches, feed_dict))

    def on_each_session(self, start):
        """Calls start(session) now, and in each new session: for threads of
        the Supervisor's that run in it, such as the sync chief's updates."""
        self._recovering_from_lost_ps(start)
        self.starts.append(start)

    def wait_for_the_others(self):
        """Until every other worker has ended or is gone: the model then
        holds the run's last step."""
        with self.stall.waiting_in('the wait for the other workers'):
            self.watchdog.wait_for_the_others()

    def close(self):
        """Ends this worker's session and the Supervisor's threads, and
        marks this worker done.

        The threads are told to stop first; closing the session then
        cancels what they are blocked in, such as the sync chief's wait for
        gradients that no worker will send any more; only then can they be
        joined. Done only once the session is closed: closing still needs
        the ps tasks, which may leave once every worker is done.
        """
        with self.stall.waiting_in('the end of the session'):
            if self.logdir:  # the chief: a last checkpoint, of the last step
                self.watchdog.wait_for_the_others()
                step = self.logdir.save_checkpoint(self.sv, self.session)
                if step is not None:
                    self.logdir.say_done(step)
            self.watchdog.pause()
            self.sv.request_stop()
            # A thread that failed leaves the session to the error's end.
            failed = self._thread_error() is not None
            if not failed:
                self.session.close()
            self.sv.stop(close_summary_writer=False)
            if self.sv.summary_writer:
                self.logdir.close_summaries(self.sv.summary_writer)
            if not failed:
                self.watchdog.mark_done()
        self.stall.stop()

    def _recovering_from_lost_ps(self, call):
        while True:
            try:
                error = self._thread_error()
                if errors.is_lost(error):
                    raise error
                return call(self.session)
            except tf.errors.OpError as e:
                if not errors.is_lost(e):
                    raise
                self._recover(e)

    def _thread_error(self):
        """The error a thread of the Supervisor's stopped on, if any."""
        if not self.sv.coord.should_stop():
            return None
        try:
            self.sv.coord.raise_requested_exception()
        except Exception as e:  # any: LOST is recovered from; any other,
            return e            # sv.stop() raises in close()
        return None

    def _ps_lost_by_a_thread(self):
        """The Watchdog's: the Supervisor's threads stopped on a lost ps
        while the main thread may wait for a token on a ps that stayed.
        Each poll again until the main thread is out: the call may meet the
        broken connection, and another worker may take what it gives."""
        def free():
            while not self._recovering.is_set():
                try:
                    self.tokens.free_a_waiting_worker(self.session)
                except (tf.errors.OpError, RuntimeError):
                    pass  # a ps cannot answer, or the session is closing
                time.sleep(liveness.Watchdog.POLL_SECS)
        if self.tokens:
            self._freeing = threading.Thread(target=free, daemon=True)
            self._freeing.start()

    def _recover(self, error):
        """Waits for every ps task to answer, and opens a new session; or,
        after timeouts.ps, raises TaskFailed naming the ps task it lost."""
        self._recovering.set()
        self.watchdog.pause()
        self.sv.coord.request_stop(error)
        deadline = time.time() + self.timeouts.ps
        print('worker=%d: %s; waiting up to %g s for it' % (
            self.index, self._lost(error, self._missing_ps()),
            self.timeouts.ps), flush=True)
        with self._ending_if_ps_away(self.timeouts.ps, error), \
                self.stall.waiting_in('the wait for a lost ps',
                                      watch_ps=False):
            while True:
                missing = self._missing_ps()
                if not missing:
                    try:
                        self._reopen(error)
                        return
                    except tf.errors.OpError as e:
                        if not errors.is_lost(e):
                            raise
                        error = e
                if time.time() > deadline:
                    raise TaskFailed(self._lost(error, missing))
                time.sleep(0.5)

    def _missing_ps(self):
        """The ps tasks that do not answer at their address."""
        return {i for i, address in enumerate(self.cluster.job_tasks('ps'))
                if not probes.answers(address)}

    def _silent_ps(self):
        return ['/job:ps/task:%d (%s)' % (i, self.cluster.task_address(
            'ps', i)) for i in sorted(self._missing_ps())]

    @contextlib.contextmanager
    def _ending_if_ps_away(self, secs, error=None):
        """Ends this worker, through the stall watch, naming the lost ps
        task, if a ps task does not answer at a deadline, every `secs`,
        until the block is done."""
        # Opening a session waits in TensorFlow, with no timeout, for a ps
        # that went away after a probe found it listening.
        done = threading.Event()

        def end_if_ps_away():
            while not done.wait(secs):
                missing = self._missing_ps()
                if missing and not done.is_set():
                    self.stall.fail(self._lost(error, missing))

        threading.Thread(target=end_if_ps_away, daemon=True).start()
        try:
            yield
        finally:
            done.set()

    def _lost(self, error, missing):
        return errors.lost_connection(self.cluster, error,
                                      ('worker', self.index), missing)

    def _reopen(self, error):
        self._stop_threads(error)
        self._open(reopened=True)
        step = self.session.run(self.sv.global_step)
        print('worker=%d: resuming at global_step=%d' % (self.index, step),
              flush=True)
        for start in self.starts:
            start(self.session)

    def _stop_threads(self, error):
        """Stops the Supervisor's threads, the Watchdog among them, with the
        error, and closes the session they ran in."""
        self.sv.coord.request_stop(error)
        self.watchdog.join(self.STOP_SECS)
        if self._freeing:  # it runs in the session
            self._freeing.join(self.STOP_SECS)
        # Closing cancels what they wait for; it may wait on a lost ps.
        threading.Thread(target=self.session.close, daemon=True).start()
        try:
            self.sv.coord.join(stop_grace_period_secs=self.STOP_SECS,
                               ignore_live_threads=True)
        except Exception as e:  # any a thread stopped on before: said,
            if not errors.is_lost(e):  # unless it is the one recovered from
                print('worker=%d: a thread stopped: %s'
                      % (self.index, errors.what_went_wrong(e)), flush=True)
        self.sv.coord.clear_stop()

    def _open(self, reopened=False):
        sv = self.sv
        with errors.failing_if_misplaced(self.cluster):
            self.watchdog = liveness.Watchdog(
                sv, self.server, self.config, self.place,
                self.timeouts.startup, self.stall.step, self.stall.fail,
                on_departure=self.tokens and (
                    lambda: self.tokens.on_departure(self.session)),
                on_ps_lost=self._ps_lost_by_a_thread)
            sess = session_start.open_session(
                sv, self.server.target, self.config, self.cluster,
                self.logdir and self.logdir.path, self.timeouts.startup,
                reopened)
        if self.logdir:  # the chief
            sv.loop(self.logdir.save_checkpoint_secs,
                    self.logdir.save_checkpoint, args=(sv, sess))
        self.session = sess
        self._recovering.clear()
        self.watchdog.watch_training(sess)
