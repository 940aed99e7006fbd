"""Which tasks live (ps_cluster/liveness.py): many workers complete, their
cost per worker flat (bench/bench_scale.py measures it); a worker lost, and
the others go on; a worker that fails at start-up says why to the others.
"""

import os
import re
import signal
import time

import pytest

from conftest import (LONG_RUN, SCRIPTS, assert_clean_exit,
                      assert_interrupted, assert_one_error_line,
                      final_accuracies, listening, run_accuracy)

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


def test_a_worker_that_fails_at_start_tells_the_others(procs, free_ports,
                                                       small_data, tmp_path):
    """Side by side: an async chief and evaluator whose --logdir is a
    regular file; every async worker, and the evaluator, on data that does
    not fit --validation_size; an async chief alone on such data, beside an
    evaluator that follows its --logdir; a sync
    worker 2 on such data, beside an evaluator, every task with
    --export_dir; a lone chief with both mistakes, which it finds in the
    order flags, data, --logdir, server. A worker that fails tries for a
    few seconds to reach the ps: here each ps is up first, as the 14
    processes' imports on 2 cores may lie far apart."""
    a_file = tmp_path / 'a-file'
    a_file.write_text('')
    flags = ['--data_dir=' + small_data, '--epochs=3', '--validation_size=100']
    too_few = '--validation_size=2000'
    clusters = {
        'logdir-': ('async', ['--logdir=%s' % a_file], None),
        'data-': ('async', [too_few, '--logdir=%s' % (tmp_path / 'data')],
                  None),
        'chief-': ('async', ['--logdir=%s' % (tmp_path / 'chief')], 0),
        'sync-': ('sync', ['--logdir=%s' % (tmp_path / 'logdir'),
                           '--export_dir=%s' % (tmp_path / 'export')], 2)}
    ports = {name: free_ports(4) for name in clusters}
    ps = {name: procs.script(script, 'ps', 0, ports[name][:1],
                             ports[name][1:], *flags, *extra, name=name)
          for name, (script, extra, _) in clusters.items()}
    deadline = time.time() + 60
    while not all(listening(p[0]) for p in ports.values()):
        assert time.time() < deadline, 'a ps never came up'
        time.sleep(0.2)
    workers = {name: [procs.script(
        script, job, i, ports[name][:1], ports[name][1:], *flags, *extra,
        *([too_few] if (job, i) == ('worker', bad) else []), name=name)
        for job, i in [('worker', 0), ('worker', 1), ('worker', 2),
                       ('evaluator', 0)]]
        for name, (script, extra, bad) in clusters.items()}
    lone = free_ports(2)
    both = procs.script('async', 'worker', 0, lone[:1], lone[1:], *flags,
                        too_few, '--logdir=%s' % a_file, name='both-')

    chief, worker1, worker2, evaluator = workers['logdir-']
    procs.wait_all([chief, evaluator], 60)
    assert_one_error_line(procs, evaluator, 2,
                          '--logdir=%s: cannot write there' % a_file)
    reason = assert_one_error_line(
        procs, chief, 2, '--logdir=%s: cannot write there' % a_file).split(
        ': error: ', 1)[1]
    procs.wait_all([worker1, worker2, ps['logdir-']], 10)
    for worker in (worker1, worker2):
        assert_one_error_line(
            procs, worker, 1, 'the chief, /job:worker/task:0',
            'went away before the model was ready: "%s"' % reason)
    assert re.search(r'^/job:ps/task:0: every worker has ended; '
                     r'/job:worker/task:0 \(localhost:\d+\) left \(and 2 '
                     r'more: their own lines say why\): "%s"$'
                     % re.escape(reason),
                     assert_clean_exit(procs, ps['logdir-'], 0), re.M)

    procs.wait_all(workers['data-'], 60)
    for worker in workers['data-']:  # the evaluator among them
        assert_one_error_line(procs, worker, 1, '1100 training images')
    procs.wait_all([ps['data-']], 20)
    assert re.search(r'^/job:ps/task:0: every worker has ended; '
                     r'/job:worker/task:0 \(localhost:\d+\) left \(and 2 '
                     r'more: their own lines say why\): "\S+ has 1100 '
                     r'training images', assert_clean_exit(procs, ps['data-'],
                                                           0), re.M)

    chief, worker1, worker2, evaluator = workers['chief-']
    procs.wait_all([chief], 60)
    reason = assert_one_error_line(procs, chief, 1,
                                   '1100 training images').split(
        ': error: ', 1)[1]
    procs.wait_all([worker1, worker2, ps['chief-']], 10)
    # The evaluator looks every 2 s, once its own start-up is over.
    procs.wait_all([evaluator], 20)
    for worker in (worker1, worker2):
        assert_one_error_line(
            procs, worker, 1, 'the chief, /job:worker/task:0',
            'went away before the model was ready: "%s"' % reason)
    assert_one_error_line(procs, evaluator, 1, 'the chief, /job:worker/task:0'
                          ', left before global_step=90: "%s"' % reason)
    assert_clean_exit(procs, ps['chief-'], 0)

    chief, worker1, worker2, evaluator = workers['sync-']
    procs.wait_for_output(chief, r'^worker=0, final accuracy = ', 90)
    procs.wait_all(workers['sync-'] + [ps['sync-']], 30)
    reason = assert_one_error_line(procs, worker2, 1,
                                   '1100 training images').split(
        ': error: ', 1)[1]
    for worker in (chief, worker1, evaluator):
        assert_clean_exit(procs, worker, 0)
    assert re.search(r'^/job:ps/task:0: every worker has ended; '
                     r'/job:worker/task:2 \(localhost:\d+\) left: "%s"$'
                     % re.escape(reason),
                     assert_clean_exit(procs, ps['sync-'], 0), re.M)
    # One SavedModel, at the run's last step, whichever task wrote it.
    assert os.listdir(tmp_path / 'export') == ['30']
    outputs = procs.output(chief) + procs.output(evaluator)
    assert len(re.findall(r': exported the model at global_step=30 ',
                          outputs)) == 1
    assert len(re.findall(r': the model at global_step=30 is exported '
                          r'already, to ', outputs)) == 1

    procs.wait_all([both], 60)
    assert_one_error_line(procs, both, 1, '1100 training images')
    assert not listening(lone[1])

    for proc in procs.running:
        assert 'did not come up' not in procs.output(proc)
        assert 'did not initialize' not in procs.output(proc)
