"""Whether another task is up: its port open, its server answering a call
within a deadline; the start-up wait for them; and a word told to each
that answers."""

import contextlib
import socket

import grpc

from ps_cluster import server
from ps_cluster.deadlines import call_within, poll
from ps_cluster.exits import TaskFailed

# A worker counts its startup timeout from when it reached the ps; the ps,
# from its own start, waits this much longer for a worker that never came,
# so that a worker waiting for a chief that never came names it itself.
STARTUP_GRACE_SECS = 5


def answers(address, timeout=2.0):
    """Whether the TensorFlow server at address answers a call within
    timeout: a frozen process still accepts connections, so an open port is
    not enough. Not a session run: one of those can block past its own
    timeout on a frozen ps. GetStatus's request is an empty message."""
    with grpc.insecure_channel(address) as channel:
        get_status = channel.unary_unary(
            '/tensorflow.WorkerService/GetStatus',
            request_serializer=lambda _: b'', response_deserializer=len)
        try:
            get_status(None, timeout=timeout)
            return True
        except grpc.RpcError:
            return False


def tell_each(tasks, tell, secs):
    """tell(name) for each of tasks ({name: address}) that answers, until
    it says it told; those not told yet, again every 0.2 s for secs, and
    the last pass within the time a try of each may take (a probe, and a
    one-call session's three steps) more: a task that froze as it was told
    holds one for good. Returns the names of those it could not tell."""
    untold = dict(tasks)

    def tell_those_up():
        nonlocal untold
        for name, address in list(untold.items()):
            # A frozen task accepts connections: only those that answer.
            # Bound anew as each is told, not changed: the caller reads it
            # once the time is up.
            if answers(address, 1.0) and tell(name):
                untold = {other: where for other, where in untold.items()
                          if other != name}
        return not untold
    with contextlib.suppress(TimeoutError):
        call_within(secs + len(tasks) * (1 + 3 * server.CALL_SECS), poll,
                    tell_those_up, secs, 0.2)
    return sorted(untold)


def is_listening(address, timeout=1.0):
    host, _, port = address.rpartition(':')
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return True
    except OSError:
        return False


def silent(cluster, job):
    """The indices of the tasks of `job` that do not answer."""
    return [i for i, address in enumerate(cluster.job_tasks(job))
            if not answers(address)]


def wait_for_tasks(cluster, job, deadline):
    """Blocks until every task of `job` accepts connections: it is up, if
    perhaps not yet serving (answers() then tells); or raises NotUp
    once the deadline (a Deadline) has passed."""
    addresses = cluster.job_tasks(job)
    if not poll(lambda: all(map(is_listening, addresses)), deadline.left(),
                0.2):
        fail_if_late(job, addresses, {i for i, address in enumerate(addresses)
                                      if not is_listening(address)}, deadline)


class NotUp(TaskFailed):
    """A task that did not come up: it never listened within a deadline."""


def fail_if_late(job, addresses, missing, deadline):
    """Raises NotUp, naming the first of the missing tasks of `job`, once
    the deadline (a Deadline) has passed."""
    if missing and not deadline.left():
        i = min(missing)
        raise NotUp('/job:%s/task:%d (%s) did not come up %s'
                    % (job, i, addresses[i], deadline))
