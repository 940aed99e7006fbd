"""Whether a task is up (ps_cluster/probes.py): in-process, against real
sockets and an in-process TensorFlow server, what each probe tells and the
start-up wait's line; and the cluster test of what only a cluster shows: a
task missing at start-up is named, by every task that waits for it."""

import contextlib
import os
import shutil
import socket
import threading
import time

import pytest

from conftest import REPO, SHORT_RUN, START_UP, assert_one_error_line
from ps_cluster import exits, probes
from ps_cluster.deadlines import Deadline, Limit

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
import tensorflow.compat.v1 as tf  # noqa: E402

tf.disable_v2_behavior()


def address(sock):
    return 'localhost:%d' % sock.getsockname()[1]


@pytest.fixture
def closed():
    """A port bound and not listening: a connection is refused, and no other
    process can take the port meanwhile."""
    with socket.socket() as sock:
        sock.bind(('localhost', 0))
        yield sock


@pytest.fixture
def listening():
    with socket.create_server(('localhost', 0)) as sock:
        yield sock


def test_is_listening(listening, closed):
    assert probes.is_listening(address(listening))
    assert not probes.is_listening(address(closed))


def test_a_tensorflow_server_answers():
    server = tf.train.Server.create_local_server()
    assert server.target.startswith('grpc://')
    assert probes.answers(server.target[len('grpc://'):])


def test_a_port_that_is_no_tensorflow_server_does_not_answer(listening,
                                                             closed):
    # As a frozen ps: it accepts the connection and says nothing.
    started = time.monotonic()
    assert not probes.answers(address(listening), timeout=0.3)
    assert time.monotonic() - started < 2
    assert not probes.answers(address(closed), timeout=0.3)


def test_the_wait_for_tasks_ends_once_every_task_listens(listening, closed):
    cluster = tf.train.ClusterSpec({'ps': [address(listening),
                                           address(closed)],
                                    'worker': ['localhost:1']})
    # ps 1 comes up during the wait; the worker is not waited for.
    threading.Timer(0.3, closed.listen).start()
    probes.wait_for_tasks(cluster, 'ps',
                          Deadline(Limit(10, '--startup_timeout')))


def test_the_wait_for_tasks_names_the_first_task_missing(listening, closed):
    tasks = [address(listening), address(closed), address(closed)]
    cluster = tf.train.ClusterSpec({'ps': tasks})
    with pytest.raises(exits.TaskFailed) as failed:
        probes.wait_for_tasks(cluster, 'ps',
                              Deadline(Limit(0.3, '--startup_timeout')))
    assert failed.value.message == (
        '/job:ps/task:1 (%s) did not come up within 0.3 s '
        '(--startup_timeout)' % tasks[1])


def test_fail_if_late_only_after_the_deadline():
    tasks = ['a:1', 'b:2', 'c:3']
    late = Deadline(Limit(5, '--startup_timeout'))
    late.at = time.monotonic() - 1
    due = Deadline(Limit(5, '--startup_timeout'), grace=55)
    probes.fail_if_late('worker', tasks, {1, 2}, due)
    probes.fail_if_late('worker', tasks, set(), late)
    with pytest.raises(exits.TaskFailed) as failed:
        probes.fail_if_late('worker', tasks, {2, 1}, late)
    assert (failed.value.message, failed.value.status) == (
        '/job:worker/task:1 (b:2) did not come up within 5 s '
        '(--startup_timeout)', 1)


@pytest.mark.slow  # not in the fast tier
def test_a_task_missing_at_start_up(procs, free_ports, small_data, tmp_path):
    """Each case its own tasks, all at once: a ps that never comes, to a
    worker and to a chief; a chief that never comes, to a worker and the ps;
    a ps whose port answers the worker's probe and then nothing is there
    (opening a session would wait in TensorFlow for good), to the chief and
    to another worker."""
    flags = ['--data_dir=' + small_data] + SHORT_RUN
    started = time.time()
    ports = free_ports(4)
    no_ps = procs.script('async', 'worker', 1, ports[:1], ports[1:], *flags,
                         '--startup_timeout=3', name='no-ps-')
    # ~ as a shell would expand it, had it not been after '='. The data is
    # read, and the chief waits for the ps that is not there.
    home = tmp_path / 'home'
    shutil.copytree(small_data, str(home / 'data'))
    ports = free_ports(2)
    tilde = procs.forked(
        'mnist_dist_async.py',
        ['--job_name=worker', '--ps=localhost:%d' % ports[0],
         '--worker=localhost:%d' % ports[1], '--data_dir=~/data',
         '--logdir=~/logdir', '--startup_timeout=3', '--validation_size=100'],
        'tilde-chief', env={'HOME': str(home)})
    # The ps waits longer than the worker: the worker gives up first unless
    # its start-up lags the ps's by 20 s.
    ports = free_ports(4)
    no_chief = [procs.script('async', job, 0 if job == 'ps' else 1,
                             ports[:1], ports[1:], *flags,
                             '--startup_timeout=%d' % secs, name='no-chief-')
                for job, secs in (('ps', 20), ('worker', 5))]
    lost = [free_ports(4) for index in (0, 1)]
    with contextlib.ExitStack() as stack:
        answering = [stack.enter_context(socket.create_server(('', p[0])))
                     for p in lost]
        lost_ps = [procs.script('async', 'worker', index, p[:1], p[1:],
                                *flags, '--startup_timeout=5',
                                name='lost-ps-')
                   for index, p in enumerate(lost)]
        for port in answering:
            port.settimeout(START_UP)
            port.accept()[0].close()
    procs.wait_all(lost_ps, START_UP)
    procs.wait_all([no_ps, tilde] + no_chief, START_UP, since=started)
    assert_one_error_line(procs, no_ps, 1, '/job:ps/task:0',
                          'did not come up within 3 s')
    assert_one_error_line(procs, tilde, 1, '/job:ps/task:0',
                          'did not come up within 3 s')
    assert (home / 'logdir').is_dir()
    assert not os.path.exists(os.path.join(REPO, '~'))
    assert_one_error_line(procs, no_chief[1], 1, 'the chief',
                          'did not initialize the model within 5 s')
    assert_one_error_line(procs, no_chief[0], 1, '/job:worker/task:0',
                          'did not come up within 20 s')
    for worker, ports in zip(lost_ps, lost):
        assert_one_error_line(procs, worker, 1, 'lost the connection to '
                              '/job:ps/task:0 (localhost:%d)' % ports[0])
