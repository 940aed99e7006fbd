"""Waiting within a deadline: a wait's deadline, a call that may block for
good in TensorFlow, and a condition polled until it holds."""

import concurrent.futures
import threading
import time


class Deadline:
    """The end of a wait, `secs` from now or from `since` (a time.monotonic()
    of the past), and `grace` more, which the flag `flag` sets; str() says
    it as a line ends a wait that timed out."""

    def __init__(self, secs, flag, grace=0, since=None):
        self.secs, self.flag = secs, flag
        start = time.monotonic() if since is None else since
        self.at = start + secs + grace

    def left(self):
        return max(0, self.at - time.monotonic())

    def __str__(self):
        return 'within %g s (%s)' % (self.secs, self.flag)


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
