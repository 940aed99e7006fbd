"""Waiting within a deadline: a call that may block for good in TensorFlow,
and a condition polled until it holds."""

import threading
import time


def call_within(secs, function, *args):
    """function(*args)'s value, or its exception, from a thread of its own;
    TimeoutError once secs have passed: the thread is left to the call,
    which may wait on a frozen ps for good."""
    outcome = []

    def call():
        try:
            outcome.append((True, function(*args)))
        except Exception as e:  # raised again in the caller's thread
            outcome.append((False, e))
    thread = threading.Thread(target=call, daemon=True,
                              name=getattr(function, '__name__', 'call'))
    thread.start()
    thread.join(secs)
    if not outcome:
        raise TimeoutError('%s took more than %g s' % (thread.name, secs))
    returned, value = outcome[0]
    if not returned:
        raise value
    return value


def poll(check, secs, every):
    """check()'s first true value, calling it every `every` seconds; its
    last, false, once `secs` have passed (None: never)."""
    deadline = None if secs is None else time.time() + secs
    while True:
        value = check()
        if value or (deadline is not None and time.time() > deadline):
            return value
        time.sleep(every)
