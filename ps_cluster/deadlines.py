"""Waiting within a deadline: a time limit and the flag that sets it, a
wait's deadline, the clock of a loss that may come back, a call that may
block for good in TensorFlow, and a condition polled until it holds."""

import collections
import concurrent.futures
import threading
import time


class Limit(collections.namedtuple('Limit', ['secs', 'flag'])):
    """A time limit in seconds and the flag that sets it, which str() says
    as a line quotes them: '120 s (--ps_timeout)'."""

    def __str__(self):
        return '%g s (%s)' % self


class Deadline:
    """The end of a wait, `limit` (a Limit) from now or from `since` (a
    time.monotonic() of the past), and `grace` more; str() says it as a
    line ends a wait that timed out."""

    def __init__(self, limit, grace=0, since=None):
        self.limit = limit
        start = time.monotonic() if since is None else since
        self.at = start + limit.secs + grace

    def left(self):
        return max(0, self.at - time.monotonic())

    def __str__(self):
        return 'within %s' % (self.limit,)


class Outage:
    """A loss that may come back (a ps task), waited for `limit` (a Limit)
    from when any thread first found it until it is over: the one clock of
    that wait, which the threads that enforce it read."""

    def __init__(self, limit):
        self.limit = limit
        self._lock = threading.Lock()
        self._since = None

    def found(self):
        """Since when (time.monotonic()) the loss is known: from the first
        call on, until over()."""
        with self._lock:
            if self._since is None:
                self._since = time.monotonic()
            return self._since

    def over(self):
        """The loss is over: a step, or a new session."""
        with self._lock:
            self._since = None

    def deadline(self):
        """The wait's Deadline, from when the loss was first found."""
        return Deadline(self.limit, since=self.found())


def time_left(secs):
    """A duration to come, as a person reads it."""
    minutes, secs = divmod(int(secs + 0.5), 60)
    return '%d min %02d s left' % (minutes, secs) if minutes else (
        '%d s left' % secs)


def in_thread(function, *args):
    """A Future of function(*args), called in a daemon thread of its own:
    one that waits on a frozen ps for good is left to it."""
    future = concurrent.futures.Future()

    def call():
        try:
            future.set_result(function(*args))
        except Exception as e:  # raised again in the caller's thread
            future.set_exception(e)
    threading.Thread(target=call, daemon=True).start()
    return future


def call_within(secs, function, *args):
    """function(*args)'s value, or its exception, from a thread of its own;
    TimeoutError once secs have passed: the thread is left to the call,
    which may wait on a frozen ps for good."""
    try:
        return in_thread(function, *args).result(secs)
    except concurrent.futures.TimeoutError:  # TimeoutError from Python 3.11
        raise TimeoutError('no answer within %g s' % secs)


def poll(check, secs, every):
    """check()'s first true value, calling it every `every` seconds; its
    last, false, once `secs` have passed."""
    deadline = time.monotonic() + secs
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(every)
