"""The session a worker trains in, and how it outlives a lost ps task: it
waits for the ps to answer again, within its timeout, and trains on in a
new session (session_start.py creates each)."""

import threading

import tensorflow.compat.v1 as tf

from ps_cluster import errors, probes
from ps_cluster.deadlines import call_within, poll
from ps_cluster.exits import TaskFailed


class RecoverableSession:
    """The session a worker trains in, as TensorFlow's _RecoverableSession
    keeps one: `creator` (a SessionCreator) creates it at open() and after
    a lost ps came back, and each hook's after_create_session() starts what
    a new session needs (the chief's checkpoint loop, sync's updates); in
    the first, once its first run, which reads where training starts, has
    returned. Only the main thread runs in it; a lost ps, found by a run or
    a thread of the Supervisor's, is waited for up to ps_timeout, and the
    failed run run again in a new session. A failure that any thread stores
    in the creator's StallWatch is raised by the next run, or by the one
    that closing the session cancels. The chief (`logdir`, a Logdir) saves
    a last checkpoint as it closes.
    """

    # How long the Supervisor's threads may take to stop, then left.
    STOP_SECS = 10

    def __init__(self, creator, hooks, ps_timeout, logdir=None):
        self.creator, self.hooks, self.sv = creator, hooks, creator.sv
        self.stall, self.place = creator.stall, creator.place
        self.cluster, self.index = creator.place.cluster, creator.place.index
        self.ps_timeout, self.logdir = ps_timeout, logdir
        self.watchdog, self._hooks_due = None, False
        # The main thread swaps the session; the stall watch closes it.
        self._lock = threading.Lock()
        self.session = None

    def open(self):
        """Creates the first session, within the creator's timeout, and
        starts the stall watch; returns self."""
        self.stall.start()
        try:
            with self.stall.waiting_in('opening a session', True,
                                       self._lost_ps, self.creator.timeout):
                self._create_session()
        except errors.LOST as e:
            raise TaskFailed(self._lost(e, ()))
        self.stall.watch(self._silent_ps, self._silent_workers,
                         self._close_session)
        return self

    def run(self, fetches, feed_dict=None):
        values = self._recovering(lambda: self.session.run(fetches, feed_dict))
        if self._hooks_due:
            self._recovering(self._after_create_session)
        return values

    def _recovering(self, call):
        """call()'s value, run again in a new session after a lost ps."""
        while True:
            try:
                self.stall.raise_if_failed()
                error = self._thread_error()
                if errors.is_lost(error):
                    raise error
                return call()
            except tf.errors.OpError as e:
                self.stall.raise_if_failed()
                if not errors.is_lost(e):
                    raise
                self._recover(e)
            except RuntimeError:  # the stall watch closed the session
                self.stall.raise_if_failed()
                raise

    def wait_for_the_others(self):
        """Until every other worker has ended or is gone: the model then
        holds the run's last step."""
        with self.stall.waiting_in('the wait for the other workers'):
            self.watchdog.wait_for_the_others()

    def close(self):
        """Ends this worker's session, the Supervisor's threads and the
        stall watch, and marks this worker done; raises a failure stored.
        Closing the session cancels what the threads, told to stop, wait in
        (the sync chief's wait for gradients that will not come); done only
        then: closing needs the ps tasks, which leave once all are done.
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
        self.stall.close()
        self.stall.raise_if_failed()
        if not failed:
            self.watchdog.mark_done()

    def _thread_error(self):
        """The error a thread of the Supervisor's stopped on, if any."""
        if not self.sv.coord.should_stop():
            return None
        try:
            self.sv.coord.raise_requested_exception()
        except Exception as e:  # any: LOST is recovered from; any other,
            return e            # sv.stop() raises in close()
        return None

    def _recover(self, error):
        """Waits for every ps task to answer, and creates a new session; or,
        after ps_timeout, raises TaskFailed naming the ps task it lost."""
        self.watchdog.pause()
        self.sv.coord.request_stop(error)
        print('worker=%d: %s; waiting up to %g s for it' % (
            self.index, self._lost(error, self._missing_ps()),
            self.ps_timeout), flush=True)

        def recovered():
            nonlocal error
            self.stall.raise_if_failed()
            if self._missing_ps():
                return False
            try:
                self._stop_threads(error)
                self._create_session(reopened=True)
                return True
            except tf.errors.OpError as e:
                if not errors.is_lost(e):
                    raise
                error = e
                return False
        first = error  # the check's, in the watch's thread
        with self.stall.waiting_in('the wait for a lost ps', False,
                                   lambda: self._lost_ps(first),
                                   self.ps_timeout):
            if not poll(recovered, self.ps_timeout, 0.5):
                raise TaskFailed(self._lost(error, self._missing_ps()))

    def _missing_ps(self):
        """The ps tasks that do not answer at their address."""
        return {i for i, address in enumerate(self.cluster.job_tasks('ps'))
                if not probes.answers(address)}

    def _silent_ps(self):
        return [self.place.task('ps', i) for i in sorted(self._missing_ps())]

    def _lost_ps(self, error=None):
        """The stall watch's check while a session opens (it waits with no
        timeout for a ps gone): a ps that does not answer is lost."""
        missing = self._missing_ps()
        return missing and self._lost(error, missing)

    def _lost(self, error, missing):
        return errors.lost_connection(self.cluster, error,
                                      ('worker', self.index), missing)

    def _silent_workers(self):
        with self._lock:
            watchdog = self.watchdog
        return watchdog.silent_workers()

    def _close_session(self):
        with self._lock:
            session = self.session
        try:
            session.close()
        except (tf.errors.OpError, RuntimeError):
            pass

    def _create_session(self, reopened=False):
        session = self.creator.create_session()
        with self._lock:
            self.session, self.watchdog = session, self.creator.watchdog
        self.watchdog.watch_training(session)
        self._hooks_due = True
        if reopened:  # the failed run, run again, may need the hooks
            print('worker=%d: resuming at global_step=%d'
                  % (self.index, session.run(self.sv.global_step)),
                  flush=True)
            self._after_create_session()

    def _after_create_session(self):
        if self._hooks_due:
            self._hooks_due = False
            for hook in self.hooks:
                hook.after_create_session(self.session, self.sv.coord)

    def _stop_threads(self, error):
        """Stops the Supervisor's threads, the Watchdog among them, with the
        error, and closes the session they ran in."""
        self.sv.coord.request_stop(error)
        # Closing cancels what they wait for; it may wait on a lost ps.
        try:
            call_within(self.STOP_SECS, self._close_session)
        except TimeoutError:
            pass
        try:
            self.sv.coord.join(stop_grace_period_secs=self.STOP_SECS,
                               ignore_live_threads=True)
        except Exception as e:  # any a thread stopped on before: said,
            if not errors.is_lost(e):  # unless it is the one recovered from
                print('worker=%d: a thread stopped: %s'
                      % (self.index, errors.what_went_wrong(e)), flush=True)
        self.sv.coord.clear_stop()
