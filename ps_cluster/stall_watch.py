"""A worker's failures, found by any thread, stored once and raised in its
main thread; and the stall watch, the one thread that ends the worker
itself when that thread, stuck in TensorFlow, does not raise one.

The watch runs TensorFlow only within a deadline: a session run, even one
with a timeout, can block for good on a frozen ps, and so can opening or
closing a session.
"""

import contextlib
import sys
import threading
import time

from ps_cluster.deadlines import call_within
from ps_cluster.exits import TaskFailed


class StallWatch:
    """This worker's failures, and its watch. fail(message), from any
    thread, stores the first failure; the watch then calls unblock()
    (closing the training session cancels the run the main thread waits
    in), and the main thread raises it (raise_if_failed()). Only if the
    worker still runs GRACE_SECS later does the watch end it itself, with
    end.fail(message): its last resort. Once watch() is called, a global
    step (step()) that has not moved for `ps_secs` while a ps task does not
    answer (silent_ps()), or for `secs` whatever the cause, is a failure
    too, naming the workers that do not beat (silent_workers()).
    """

    POLL_SECS = 1
    # How often a ps is called while steps stand still but it may answer.
    PROBE_SECS = 5
    CALL_SECS = 5
    GRACE_SECS = 3

    def __init__(self, secs, ps_secs, end):
        self.secs, self.ps_secs, self.end = secs, ps_secs, end
        self.silent_ps = self.silent_workers = self.unblock = None
        # Written by every thread of the worker, read by the watch.
        self._lock = threading.Lock()
        self._step, self._moved = None, time.time()
        # Where the main thread waits: (where, watch_ps, [check, every,
        # when next] or None), innermost last.
        self._where = [('a training run', True, None)]
        self._failure = None
        self._wake = threading.Event()
        self._watching = self._closed = False
        self._thread = threading.Thread(target=self._watch, daemon=True,
                                        name='stall watch')

    def start(self):
        self._thread.start()

    def close(self):
        """Training is over: the watch ends, and the main thread raises
        what fails from now on (a failure stored before may still end the
        worker here, GRACE_SECS later)."""
        with self._lock:
            self._closed = True
        self._wake.set()
        self._thread.join()

    def watch(self, silent_ps, silent_workers, unblock):
        """From now on, a global step that stands still is a failure."""
        with self._lock:
            self.silent_ps, self.silent_workers = silent_ps, silent_workers
            self.unblock = unblock
            self._moved, self._watching = time.time(), True

    def fail(self, message):
        """Stores a failure, from any thread: the first one is the one
        said."""
        with self._lock:
            self._failure = self._failure or message
        self._wake.set()

    def raise_if_failed(self):
        """TaskFailed, in the main thread, if a failure is stored."""
        with self._lock:
            failure = self._failure
        if failure:
            raise TaskFailed(failure)

    def step(self, value):
        """The global step as a thread of this worker just read it."""
        with self._lock:
            if value != self._step:
                self._step, self._moved = value, time.time()

    @contextlib.contextmanager
    def waiting_in(self, where, watch_ps=True, check=None, every=None):
        """Says where the main thread waits, until the block is done;
        without watch_ps, a lost ps is the wait's own to time out. With
        `check`, it is called (it may run TensorFlow) every `every` seconds
        meanwhile: a message it returns is a failure."""
        with self._lock:
            self._where.append((where, watch_ps, check and [
                check, every, time.time() + every]))
        try:
            yield
        finally:
            with self._lock:
                self._where.pop()

    def _watch(self):
        probed = 0
        while True:
            self._wake.wait(self.POLL_SECS)
            self._wake.clear()
            with self._lock:
                failure, closed = self._failure, self._closed
                watching = self._watching and not closed
                idle = time.time() - self._moved
                where, watch_ps, check = self._where[-1]
                due = check and time.time() >= check[2]
                if due:
                    check[2] = time.time() + check[1]
                silent_ps, silent_workers = self.silent_ps, self.silent_workers
            if closed:  # what fails from now on, the main thread raises
                return
            if failure:
                self._last_resort(failure)
                return
            # A check probes each ps in turn: it may take its interval.
            message = due and self._call(check[0], None, check[1])
            if message:
                self.fail(message)
            elif watching and (idle > self.secs or (
                    watch_ps and idle > self.ps_secs
                    and time.time() - probed > self.PROBE_SECS)):
                probed = time.time()
                secs = self.secs if idle > self.secs else self.ps_secs
                missing = self._call(silent_ps, [])
                if missing:
                    why = ', '.join(task + ' does not answer'
                                    for task in missing)
                elif idle > self.secs:
                    why = 'missing: ' + (', '.join(
                        self._call(silent_workers, ['unknown']))
                        or 'none')
                else:
                    continue
                with self._lock:
                    closed = self._closed
                if not closed:
                    self.fail('training stalled: no new global step for %g '
                              's, waiting in %s; %s' % (secs, where, why))

    def _last_resort(self, failure):
        """Unblocks the main thread, which raises the failure and ends the
        worker; or, if it has not within GRACE_SECS, ends it."""
        deadline = time.time() + self.GRACE_SECS
        with self._lock:
            unblock = self.unblock
        if unblock:
            self._call(unblock, None, self.GRACE_SECS)
        time.sleep(max(0, deadline - time.time()))
        self.end.fail(failure)  # it ends the worker

    def _call(self, function, otherwise, secs=None):
        """function(), or otherwise if it takes more than secs (CALL_SECS:
        it may meet a frozen ps too) or fails."""
        try:
            return call_within(secs or self.CALL_SECS, function)
        except TimeoutError:
            return otherwise
        except Exception as e:  # none expected: said, and the watch goes on
            print('stall watch: %s failed: %s' % (function.__name__, e),
                  file=sys.stderr, flush=True)
            return otherwise
