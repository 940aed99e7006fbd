"""Which tasks live (ps_cluster/liveness.py): many workers complete, their
cost per worker flat (bench/bench_scale.py measures it); a worker lost, and
the others go on; a task missing at start-up, named.
"""

import contextlib
import os
import re
import shutil
import signal
import socket
import sys
import time

import pytest

from conftest import (LONG_RUN, REPO, SCRIPTS, SHORT_RUN, assert_clean_exit,
                      assert_interrupted, assert_one_error_line,
                      final_accuracies, left_running)

pytestmark = pytest.mark.slow  # not in the fast tier


@pytest.mark.parametrize('script', ['async', 'sync'])
@pytest.mark.parametrize('num_ps', [1, 2])
def test_sixteen_workers_complete(procs, free_ports, small_data, script,
                                  num_ps):
    # Small steps, a few epochs: 17 or 18 processes take turns on 2 cores.
    ps, workers = procs.cluster(script, free_ports, '--data_dir=' + small_data,
                                '--epochs=3', '--validation_size=100',
                                '--learning_rate=0.5', num_workers=16,
                                num_ps=num_ps)
    ps = ps if num_ps > 1 else [ps]
    procs.wait_all(workers + ps, 420)
    for i, worker in enumerate(workers):
        output = procs.output(worker)
        assert worker.returncode == 0, output
        assert 'Traceback' not in output
        # The classes are separable: with 2 ps tasks, w and b apart, too.
        assert final_accuracies(output)[i] > 0.9, output
    for proc in workers + ps:
        assert proc.returncode == 0, procs.output(proc)
        assert left_running(proc) == []


# Sync workers say once which worker is gone; the chief put back the token
# it took, so training goes on. Async workers need no word: nobody waits.
GONE = r'^worker=(\d): /job:worker/task:(\d) \(localhost:\d+\) is gone; ' \
       r'training goes on without it$'


def test_a_worker_lost_and_the_others_go_on(procs, free_ports, small_data):
    """Side by side: worker 2 killed, async and sync (30 ms a step: the sync
    run outlasts the 5 s of silence after which a worker is gone, however
    fast the machine); worker 1 sent SIGINT (async) or SIGTERM (sync) to its
    process group, as Ctrl-C in its own terminal would (30 ms a step too: a
    fast machine ended a run of 400 steps before the signal came)."""
    killed = {script: procs.cluster(script, free_ports,
                                    '--data_dir=' + small_data, *LONG_RUN[1:],
                                    '--epochs=40', '--step_delay_ms=30',
                                    name=script + '-killed-')
              for script in SCRIPTS}
    signals = {'async': (signal.SIGINT, 130), 'sync': (signal.SIGTERM, 143)}
    stopped = {script: procs.cluster(script, free_ports,
                                     '--data_dir=' + small_data,
                                     *LONG_RUN[1:], '--epochs=40',
                                     '--step_delay_ms=30',
                                     name=script + '-signal-')
               for script in SCRIPTS}
    for ps, workers in killed.values():
        procs.wait_for_output(workers[2], r'^worker=2,epoch=1,', 60)
        os.kill(workers[2].pid, signal.SIGKILL)
    sent = {}
    for script, (ps, workers) in stopped.items():
        procs.wait_for_output(workers[1], r'^worker=1,epoch=1,', 60)
        os.killpg(workers[1].pid, signals[script][0])
        sent[script] = time.time()
    for script, (ps, workers) in stopped.items():
        procs.wait_all([workers[1]], 10, since=sent[script])
        assert_interrupted(procs, workers[1], signals[script][1],
                           '/job:worker/task:1')
    procs.wait_all([p for ps, workers in list(killed.values())
                    + list(stopped.values()) for p in workers + [ps]], 120)
    for script, (ps, workers) in killed.items():
        for i in (0, 1):
            output = assert_clean_exit(procs, workers[i], 0)
            assert i in final_accuracies(output)
            assert re.findall(GONE, output, re.M) == [(str(i), '2')] * (
                script == 'sync')
        assert workers[2].returncode == -signal.SIGKILL
        assert_clean_exit(procs, ps, 0)
    for ps, workers in stopped.values():
        for i in (0, 2):
            assert i in final_accuracies(assert_clean_exit(procs, workers[i],
                                                           0))
        assert_clean_exit(procs, ps, 0)


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
