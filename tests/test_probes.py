"""Whether a task is up (ps_cluster/probes.py): a task missing at start-up
is named, by every task that waits for it."""

import contextlib
import os
import shutil
import socket
import sys
import time

import pytest

from conftest import REPO, SHORT_RUN, assert_one_error_line

pytestmark = pytest.mark.slow  # not in the fast tier


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
    tilde = procs.start(
        [sys.executable, 'mnist_dist_async.py', '--job_name=worker',
         '--ps=localhost:%d' % ports[0], '--worker=localhost:%d' % ports[1],
         '--data_dir=~/data', '--logdir=~/logdir', '--startup_timeout=3',
         '--validation_size=100'], 'tilde-chief', env={'HOME': str(home)})
    ports = free_ports(4)
    no_chief = [procs.script('async', job, 0 if job == 'ps' else 1,
                             ports[:1], ports[1:], *flags,
                             '--startup_timeout=5', name='no-chief-')
                for job in ('ps', 'worker')]
    lost = [free_ports(4) for index in (0, 1)]
    with contextlib.ExitStack() as stack:
        answering = [stack.enter_context(socket.create_server(('', p[0])))
                     for p in lost]
        lost_ps = [procs.script('async', 'worker', index, p[:1], p[1:],
                                *flags, '--startup_timeout=5',
                                name='lost-ps-')
                   for index, p in enumerate(lost)]
        for port in answering:
            port.settimeout(60)
            port.accept()[0].close()
    procs.wait_all(lost_ps, 30)
    procs.wait_all([no_ps, tilde] + no_chief, 60, since=started)
    assert_one_error_line(procs, no_ps, 1, '/job:ps/task:0',
                          'did not come up within 3 s')
    assert_one_error_line(procs, tilde, 1, '/job:ps/task:0',
                          'did not come up within 3 s')
    assert (home / 'logdir').is_dir()
    assert not os.path.exists(os.path.join(REPO, '~'))
    assert_one_error_line(procs, no_chief[1], 1, 'the chief',
                          'did not initialize the model within 5 s')
    assert_one_error_line(procs, no_chief[0], 1, '/job:worker/task:0',
                          'did not come up within 5 s')
    for worker, ports in zip(lost_ps, lost):
        assert_one_error_line(procs, worker, 1, 'lost the connection to '
                              '/job:ps/task:0 (localhost:%d)' % ports[0])
