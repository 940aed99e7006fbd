"""Which tasks live (ps_cluster/liveness.py): many workers complete, their
cost per worker flat (bench/bench_scale.py measures it); a worker lost, and
the others go on.
"""

import os
import re
import signal
import time

import pytest

from conftest import (LONG_RUN, SCRIPTS, assert_clean_exit,
                      assert_interrupted, final_accuracies, run_accuracy)

pytestmark = pytest.mark.slow  # not in the fast tier


# Each script, and each of 1 and 2 ps tasks: the other two pairs run with 3
# workers (test_mnist_dist.py, test_multihost.py, test_logdir.py).
@pytest.mark.parametrize('script, num_ps', [('async', 1), ('sync', 2)])
def test_sixteen_workers_complete(procs, free_ports, small_data, script,
                                  num_ps):
    # Small steps, a few epochs: 17 or 18 processes take turns on 2 cores.
    ps, workers = procs.cluster(script, free_ports, '--data_dir=' + small_data,
                                '--epochs=3', '--validation_size=100',
                                '--learning_rate=0.5', num_workers=16,
                                num_ps=num_ps)
    ps = ps if num_ps > 1 else [ps]
    procs.wait_all(workers + ps, 420)
    outputs = [assert_clean_exit(procs, worker, 0) for worker in workers]
    for i, output in enumerate(outputs):
        assert i in final_accuracies(output), output
    # The classes are separable: with 2 ps tasks, w and b apart, too.
    assert run_accuracy(outputs, script) > 0.9
    for proc in ps:
        assert_clean_exit(procs, proc, 0)


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
