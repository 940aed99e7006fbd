"""How a task ends: one line and an exit status, at once and from any
thread, having told the other tasks why when it ends on purpose."""

import contextlib
import os
import signal
import sys
import threading

from ps_cluster.deadlines import call_within


def usage_error(message):
    """A mistake in how the task was started: one line, status 2."""
    print('%s: error: %s' % (os.path.basename(sys.argv[0]), message),
          file=sys.stderr)
    sys.exit(2)


class TaskFailed(Exception):
    """A failure that ends this task: raised where it is found, and said in
    one line, with `status`, by TaskEnd.fail()."""

    def __init__(self, message, status=1):
        super().__init__(message)
        self.message, self.status = str(message), status


class TaskEnd:
    """The end of this task, which the first thread to end it owns: a
    second one waits for good, so that Ctrl-C while a ps tells an error of
    its own changes neither the line nor the exit status. name() is this
    task's name, /job:worker/task:1."""

    # How long the last words may take: a ps gives the workers time to read
    # them.
    LAST_WORDS_SECS = 6

    def __init__(self, name):
        self.name = name
        self._ending = threading.Lock()
        # Set by the main thread only, and read, one attribute at a time, by
        # the one that ends the task.
        self._tell, self._preempted = self._silent, None

    def ending(self):
        """Whether a thread has begun to end this task."""
        return self._ending.locked()

    def before_leaving(self, tell):
        """tell(reason) will be called when this task ends on purpose (an
        error of its own or Ctrl-C; not SIGTERM, which a scheduler sends to
        a task it will start again), instead of the tell given before; None:
        nothing is told."""
        self._tell = tell or self._silent

    def on_preemption(self, save, grace):
        """SIGTERM, a scheduler's notice, will call save() first, for
        `grace` (a deadlines.Limit) at most: the line it returns is this
        task's (None: it printed its own)."""
        self._preempted = save, grace

    def fail(self, message, status=1):
        """Ends this task with a one-line error and status 1 (2: a usage
        error), once it has told the cluster why: called by the main
        thread's excepthook, and by the stall watch as its last resort.
        With os._exit: the telling may still be inside TensorFlow's C++,
        and the interpreter's clean-up can block on a lost ps for good."""
        self._end('error: %s' % message, str(message), status)

    def leave(self):
        """Ends this task at once, with status 0, once all is said and
        closed: TensorFlow cannot stop its gRPC server, and tearing the
        interpreter down around it takes a second or more for nothing."""
        self._end(None, None, 0, tell=False)

    def on_signals(self):
        """Ctrl-C (SIGINT) and SIGTERM end this task at once, with one line
        and status 130 or 143, inside sess.run too; after Ctrl-C the cluster
        is told why, after SIGTERM (a scheduler's, which may start the task
        again) it waits for it, once this task has saved what it would lose
        (on_preemption()). Python runs handlers in the main thread
        only, never while it waits in TensorFlow's C++: a thread of ours
        reads the signal number that Python's C handler writes to the wakeup
        pipe; it ends the process, and nothing joins it.
        """
        read_end, write_end = os.pipe()
        os.set_blocking(write_end, False)
        signal.set_wakeup_fd(write_end)
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda *_: None)  # the pipe's reader acts

        def end():
            signum = os.read(read_end, 1)[0]
            self._end(self._save if signum == signal.SIGTERM
                      else 'interrupted', 'interrupted', 128 + signum,
                      tell=signum == signal.SIGINT)

        threading.Thread(target=end, daemon=True, name='signals').start()

    def _end(self, line, reason, status, tell=True):
        """The cluster told `reason`, unless not `tell`; one line on
        stderr, if any, the task's last (its other threads may print while
        it tells); then the end, with status. A second end waits for
        good."""
        if not self._ending.acquire(blocking=False):
            threading.Event().wait()
        if callable(line):
            line = line()
        if tell:
            self._say_last_words(reason)
        # OSError: nobody reads stdout or stderr any more.
        with contextlib.suppress(OSError):
            sys.stdout.flush()
            if line:
                print('%s: %s' % (self.name(), line), file=sys.stderr,
                      flush=True)
        os._exit(status)

    def _save(self):
        """The line of a task preempted: what on_preemption()'s save
        returns, within its grace."""
        preempted = self._preempted
        if preempted is None:
            return 'interrupted'
        save, grace = preempted
        try:
            return call_within(grace.secs, save)
        except TimeoutError:
            return 'preempted; nothing saved within %s' % (grace,)
        except Exception as e:  # none expected: said, as it ends
            return 'preempted; cannot save: %s' % e

    @staticmethod
    def _silent(reason):
        """Tells nobody."""

    def _say_last_words(self, reason):
        """Calls what before_leaving() set up, for LAST_WORDS_SECS at most:
        a frozen ps can block a run of TensorFlow's past its timeout."""
        try:
            call_within(self.LAST_WORDS_SECS, self._tell, reason)
        except TimeoutError:
            pass
        except Exception as e:  # none expected: it tells what answers
            print('%s: cannot tell the other tasks why: %s'
                  % (self.name(), e), file=sys.stderr, flush=True)
