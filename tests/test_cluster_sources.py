"""Where the cluster comes from (flags, TF_CONFIG, Slurm), and --shard_data.
Several ps tasks are in test_liveness.py."""

import json
import re
import sys
import time

import pytest

from conftest import final_accuracies
from test_failures import assert_clean_exit, assert_one_error_line

pytestmark = pytest.mark.slow  # not in the fast tier

SMALL_RUN = ['--validation_size=100', '--epochs=3', '--learning_rate=0.5']


def tf_config(ps, workers, job, index, **jobs):
    cluster = dict(ps=['localhost:%d' % p for p in ps],
                   worker=['localhost:%d' % p for p in workers], **jobs)
    return json.dumps({'cluster': cluster,
                       'task': {'type': job, 'index': index}})


def run_tasks(procs, script, envs, *flags, timeout=120):
    """One task per environment, no cluster flags; returns their outputs."""
    tasks = [procs.start([sys.executable, 'mnist_dist_%s.py' % script]
                         + list(flags), 'task%d' % i, env=env)
             for i, env in enumerate(envs)]
    procs.wait_all(tasks, timeout)
    return [assert_clean_exit(procs, task, 0) for task in tasks]


def test_cluster_from_tf_config_in_any_start_order(procs, free_ports,
                                                   small_data):
    # Both scripts side by side, the sync one with a backup worker. Workers
    # before the ps, the chief last; the ps 3 s later.
    tasks = [('worker', 2), ('worker', 1), ('worker', 0), ('ps', 0)]
    extra = {'async': [], 'sync': ['--replicas_to_aggregate=2']}
    ports = {script: free_ports(4) for script in extra}
    started = {script: [] for script in extra}
    for job, index in tasks:
        time.sleep(3 if job == 'ps' else 1)
        for script, flags in extra.items():
            env = {'TF_CONFIG': tf_config(ports[script][:1],
                                          ports[script][1:], job, index)}
            started[script].append(procs.start(
                [sys.executable, 'mnist_dist_%s.py' % script,
                 '--data_dir=' + small_data] + SMALL_RUN + flags,
                '%s%s%d' % (script, job, index), env=env))
    procs.wait_all([p for run in started.values() for p in run], 120)
    for script, run in started.items():
        for proc, (job, index) in zip(run, tasks):
            output = assert_clean_exit(procs, proc, 0)
            assert re.search(r'^/job:%s/task:%d: cluster from TF_CONFIG: ps '
                             r'localhost:%d, workers ' % (
                                 job, index, ports[script][0]),
                             output, re.M), output
            if job == 'worker':
                assert final_accuracies(output)[index] > 0.9


def test_cluster_from_slurm(procs, free_port_run, small_data):
    base = free_port_run(4)
    envs = [{'SLURM_PROCID': str(rank), 'SLURM_STEP_ID': '0',
             'SLURM_STEP_NUM_TASKS': '4',
             'SLURM_STEP_NODELIST': 'localhost',
             'SLURM_STEP_TASKS_PER_NODE': '4', 'SLURM_JOB_ID': '42'}
            for rank in range(4)]
    outputs = run_tasks(procs, 'async', envs, '--data_dir=' + small_data,
                        '--slurm_port_base=%d' % base, '--num_ps=1',
                        *SMALL_RUN)
    # The first task is the ps, the others workers 0 to 2, on ports from
    # the base up.
    assert ('/job:ps/task:0: cluster from Slurm: ps localhost:%d, workers '
            'localhost:%d,localhost:%d,localhost:%d'
            % (base, base + 1, base + 2, base + 3)) in outputs[0]
    for rank in (1, 2, 3):
        assert final_accuracies(outputs[rank])[rank - 1] > 0.9


SOURCE_ERRORS = [
    ({'TF_CONFIG': tf_config([9001], [9002], 'worker', 0)},
     ['--ps=localhost:9001'], ['both --ps/--worker and TF_CONFIG']),
    ({'TF_CONFIG': tf_config([9001], [9002, 9003], 'worker', 1)},
     ['--task_index=0'], ['--task_index=0, but TF_CONFIG says 1']),
    ({'TF_CONFIG': tf_config([9001], [9002], 'worker', 0,
                             chief=['localhost:9005'])},
     [], ['TF_CONFIG', 'needs jobs ps and worker']),
    ({'TF_CONFIG': '{"cluster": '}, [], ['TF_CONFIG']),
    ({}, [], ['--job_name is required']),
]


def test_cluster_source_errors(procs):
    # A process for each, all at once.
    bad = [procs.start([sys.executable, 'mnist_dist_async.py'] + flags,
                       'bad%d' % n, env=env)
           for n, (env, flags, _) in enumerate(SOURCE_ERRORS)]
    procs.wait_all(bad, 60)
    for proc, (_, _, words) in zip(bad, SOURCE_ERRORS):
        assert_one_error_line(procs, proc, 2, *words)


def test_shard_data(procs, free_ports, small_data):
    # 1,000 training images: each of 3 workers walks its own 334 or 333,
    # 3 batches of 100 an epoch.
    ps, workers = procs.cluster('async', free_ports, '--data_dir=' + small_data,
                                *SMALL_RUN, '--shard_data',
                                '--print_every_epochs=1')
    procs.wait_all(workers + [ps], 120)
    for i, worker in enumerate(workers):
        output = assert_clean_exit(procs, worker, 0)
        local_steps = re.findall(r'^worker=%d,epoch=\d+,global_step=\d+, '
                                 r'local_step=(\d+),' % i, output, re.M)
        assert local_steps == ['3', '6', '9']
