"""The stall watch: a worker whose training makes no step, or whose other
threads found a failure, ends, whatever its main thread waits in, with one
line saying why.

A thread of plain Python that never runs TensorFlow itself: a session run,
even one with a timeout, can block for good on a frozen ps, and so can
opening or closing a session, and the threads that would notice.
"""

import concurrent.futures
import contextlib
import sys
import threading
import time


class StallWatch:
    """The one thread that ends this worker while its main thread may be
    stuck in TensorFlow: at once for a failure another thread hands it
    (fail()); and, once watch() is called, when the global step it is told
    of has not moved for `ps_secs` while a ps task does not answer, or for
    `secs` whatever the cause.

    silent_ps() names the ps tasks that do not answer, silent_workers() the
    workers that do not beat; each may run TensorFlow, and is given a few
    seconds at most. die(message) ends the worker.
    """

    POLL_SECS = 1
    # How often a ps is called while steps stand still but it may answer.
    PROBE_SECS = 5
    CALL_SECS = 5

    def __init__(self, secs, ps_secs, die):
        self.secs, self.ps_secs, self.die = secs, ps_secs, die
        self.silent_ps = self.silent_workers = None
        self._lock = threading.Lock()
        self._step, self._moved = None, time.time()
        self._where = [('a training run', True)]
        self._failure = None
        self._wake = threading.Event()
        self._watching = self._stopped = False
        threading.Thread(target=self._watch, daemon=True).start()

    def watch(self, silent_ps, silent_workers):
        """From now on, a global step that stands still ends the worker."""
        with self._lock:
            self.silent_ps, self.silent_workers = silent_ps, silent_workers
            self._moved, self._watching = time.time(), True

    def fail(self, message):
        """Ends this worker at once, from the watch's thread: the first
        failure handed over is the one said."""
        with self._lock:
            self._failure = self._failure or message
        self._wake.set()

    def step(self, value):
        """The global step as a thread of this worker just read it."""
        with self._lock:
            if value != self._step:
                self._step, self._moved = value, time.time()

    @contextlib.contextmanager
    def waiting_in(self, where, watch_ps=True):
        """Says where the main thread waits, until the block is done;
        without watch_ps, a lost ps is the wait's own to time out."""
        with self._lock:
            self._where.append((where, watch_ps))
        try:
            yield
        finally:
            with self._lock:
                self._where.pop()

    def stop(self):
        """Training is over: steps stand still from now on. A failure
        handed over still ends the worker."""
        with self._lock:
            self._stopped = True

    def _watch(self):
        probed = 0
        while True:
            self._wake.wait(self.POLL_SECS)
            with self._lock:
                failure = self._failure
                watching = self._watching and not self._stopped
                idle = time.time() - self._moved
                where, watch_ps = self._where[-1]
            if failure:
                self.die(failure)  # it ends the worker
                return
            if not watching:
                continue
            if idle > self.secs or (
                    watch_ps and idle > self.ps_secs
                    and time.time() - probed > self.PROBE_SECS):
                probed = time.time()
                missing = self._call(self.silent_ps, [])
                if missing:
                    self._end(self.secs if idle > self.secs else self.ps_secs,
                              where, ', '.join(task + ' does not answer'
                                               for task in missing))
                if idle > self.secs:
                    self._end(self.secs, where, 'missing: ' + (', '.join(
                        self._call(self.silent_workers, ['unknown']))
                        or 'none'))

    def _call(self, function, otherwise):
        """function(), or otherwise if it takes more than CALL_SECS (it may
        meet a frozen ps too) or fails."""
        pool = concurrent.futures.ThreadPoolExecutor(1)
        try:
            return pool.submit(function).result(self.CALL_SECS)
        except concurrent.futures.TimeoutError:
            return otherwise
        except Exception as e:  # none expected: said, and the watch goes on
            print('stall watch: %s failed: %s' % (function.__name__, e),
                  file=sys.stderr, flush=True)
            return otherwise
        finally:
            pool.shutdown(wait=False)

    def _end(self, secs, where, why):
        with self._lock:
            stopped, failure = self._stopped, self._failure
        if failure:  # handed over while the probes ran: it is the cause
            self.die(failure)
        elif not stopped:
            self.die('training stalled: no new global step for %g s, '
                     'waiting in %s; %s' % (secs, where, why))
