"""Where the cluster comes from (ps_cluster/sources.py): host lists,
TF_CONFIG, Slurm's variables, and what each says when it is wrong. Slurm
itself runs in test_slurm.py."""

import json
import re

import pytest

from ps_cluster import sources

from conftest import (START_UP, assert_clean_exit, evaluations,
                      final_accuracies, run_accuracy)
from script_flags import usage_error


@pytest.mark.parametrize('value, hosts', [
    ('localhost:9001', ['localhost:9001']),
    ('a:1, b.example.org:2,10.0.0.3:65535',
     ['a:1', 'b.example.org:2', '10.0.0.3:65535']),
    ('[::1]:9001', ['[::1]:9001']),
])
def test_parse_host_list(value, hosts):
    assert sources.parse_host_list(value) == hosts


@pytest.mark.parametrize('value', [
    '', 'localhost', 'localhost:', ':9001', 'localhost:port',
    'localhost:0', 'localhost:65536', 'a:1,,b:2', 'a:1;b:2'])
def test_parse_host_list_rejects(value):
    with pytest.raises(ValueError, match='is not host:port'):
        sources.parse_host_list(value)


@pytest.mark.parametrize('value, hosts', [
    ('node[9-10,12],gpu01', ['node9', 'node10', 'node12', 'gpu01']),
    ('n[08-10]-ib', ['n08-ib', 'n09-ib', 'n10-ib']),
])
def test_expand_hostlist(value, hosts):
    assert sources.expand_hostlist(value) == hosts


@pytest.mark.parametrize('value', ['', 'node[9-', 'a,,b', 'n[1-2'])
def test_expand_hostlist_rejects(value):
    with pytest.raises(ValueError, match='is not a Slurm host list'):
        sources.expand_hostlist(value)


@pytest.mark.parametrize('distribution, placement', [
    ('block', ['a', 'a', 'a', 'a', 'a', 'b', 'c', 'd']),
    # Measured on Slurm 22.05: srun -N4 -n8 -m cyclic gave 5,1(x3).
    ('cyclic', ['a', 'b', 'c', 'd', 'a', 'a', 'a', 'a']),
])
def test_slurm_placement(distribution, placement):
    assert sources.slurm_placement(
        ['a', 'b', 'c', 'd'], sources.expand_tasks_per_node('5,1(x3)'),
        distribution) == placement


def test_slurm_evaluator_is_the_last_task():
    env = {'SLURM_STEP_NODELIST': 'node[9-10]', 'SLURM_STEP_TASKS_PER_NODE':
           '2(x2)', 'SLURMD_NODENAME': 'node10', 'SLURM_PROCID': '3'}
    cluster, job, index = sources.from_slurm(1, 2222, True, env)
    assert cluster.as_dict() == {'ps': ['node9:2222'],
                                 'worker': ['node9:2223', 'node10:2222']}
    assert (job, index) == ('evaluator', 0)
    with pytest.raises(ValueError, match='beside the evaluator'):
        sources.from_slurm(3, 2222, True, env)


def test_slurm_placement_refuses_what_it_cannot_map():
    with pytest.raises(ValueError, match='distribution arbitrary'):
        sources.slurm_placement(['a'], [1], 'arbitrary')


# 6 epochs, as in test_mnist_dist.py: an async chief started last may make
# all its steps before the others start, and 3 epochs of its own (30 steps)
# left it at 0.848.
SMALL_RUN = ['--validation_size=100', '--epochs=6', '--learning_rate=0.5']


def tf_config(ps, workers, job, index, **jobs):
    cluster = dict(ps=['localhost:%d' % p for p in ps],
                   worker=['localhost:%d' % p for p in workers], **jobs)
    return json.dumps({'cluster': cluster,
                       'task': {'type': job, 'index': index}})


def run_tasks(procs, script, envs, *flags, timeout=START_UP):
    """One task per environment, no cluster flags; returns their outputs."""
    tasks = [procs.forked('mnist_dist_%s.py' % script, flags, 'task%d' % i,
                          env=env) for i, env in enumerate(envs)]
    procs.wait_all(tasks, timeout)
    return [assert_clean_exit(procs, task, 0) for task in tasks]


# Each script's tasks in TF_CONFIG's shape, task by task: (type, index) of
# TF_CONFIG, and the task of the TF1 scripts' cluster it is. The TF1 shape
# (worker 0 the chief), and TensorFlow 2's, a chief job beside the workers,
# as Volcano's tensorflow plugin and a TFJob with a Chief write it.
TF1_SHAPE = [(('evaluator', 0), 'evaluator', 0), (('worker', 2), 'worker', 2),
             (('worker', 1), 'worker', 1), (('worker', 0), 'worker', 0),
             (('ps', 0), 'ps', 0)]
CHIEF_SHAPE = [(('evaluator', 0), 'evaluator', 0), (('worker', 1), 'worker', 2),
               (('worker', 0), 'worker', 1), (('chief', 0), 'worker', 0),
               (('ps', 0), 'ps', 0)]


def tf_config_of(ports, job, index, chief):
    """TF_CONFIG of 1 ps and 3 workers at ports, with an evaluator listed
    as Estimator and Volcano list it (Kubeflow does not); in the chief
    shape, worker 0 as the chief job."""
    hosts = ['localhost:%d' % p for p in ports]
    cluster = {'ps': hosts[:1], 'worker': hosts[1:],
               'evaluator': ['localhost:1']}
    if chief:
        cluster.update(chief=hosts[1:2], worker=hosts[2:])
    return json.dumps({'cluster': cluster,
                       'task': {'type': job, 'index': index}})


@pytest.mark.slow
def test_cluster_from_tf_config_in_any_start_order(procs, free_ports,
                                                   small_data, tmp_path):
    # The three scripts side by side: sync in the TF1 shape, with a backup
    # worker; async and tf2 with a chief job. An evaluator first, which is
    # no task of the cluster; the workers before the ps, the chief last;
    # each started once the one before knows its cluster.
    shapes = {'async': CHIEF_SHAPE, 'sync': TF1_SHAPE, 'tf2': CHIEF_SHAPE}
    extra = {script: ['--logdir=%s' % (tmp_path / script)] for script in
             shapes}
    extra['sync'].append('--replicas_to_aggregate=2')
    ports = {script: free_ports(4) for script in shapes}
    started = {script: [] for script in shapes}
    for step in range(5):
        for script, shape in shapes.items():
            (job, index), _, _ = shape[step]
            env = {'TF_CONFIG': tf_config_of(ports[script], job, index,
                                             shape is CHIEF_SHAPE)}
            started[script].append(procs.forked(
                'mnist_dist_%s.py' % script,
                ['--data_dir=' + small_data] + SMALL_RUN + extra[script],
                '%s%s%d' % (script, job, index), env=env))
        for run in started.values():
            procs.wait_for_output(run[-1], r': cluster from TF_CONFIG: ',
                                  START_UP)
    procs.wait_all([p for run in started.values() for p in run],
                   START_UP)
    for script, run in started.items():
        for proc, (_, job, index) in zip(run, shapes[script]):
            output = assert_clean_exit(procs, proc, 0)
            assert re.search(r'^/job:%s/task:%d: cluster from TF_CONFIG: ps '
                             r'localhost:%d, workers ' % (
                                 job, index, ports[script][0]),
                             output, re.M), output
            if job == 'worker' and (script != 'tf2' or index == 0):
                assert index in final_accuracies(output)
            if job == 'evaluator':  # to the last step: 6 epochs of 10
                assert evaluations(output)[-1][0] == (
                    60 if script == 'sync' else 180)
        workers = [procs.output(proc) for proc, (_, job, _) in
                   zip(run, shapes[script]) if job == 'worker']
        accuracy = (final_accuracies(workers[-1])[0] if script == 'tf2'
                    else run_accuracy(workers, script))
        assert accuracy > 0.9


@pytest.mark.slow
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
        assert rank - 1 in final_accuracies(outputs[rank])
    assert run_accuracy(outputs[1:], 'async') > 0.9


SOURCE_ERRORS = [
    ({'TF_CONFIG': tf_config([9001], [9002], 'worker', 0)},
     ['--ps=localhost:9001'], ['both --ps/--worker and TF_CONFIG']),
    ({'TF_CONFIG': tf_config([9001], [9002, 9003], 'worker', 1)},
     ['--task_index=0'], ['--task_index=0, but TF_CONFIG says 1']),
    ({'TF_CONFIG': tf_config([9001], [9002], 'worker', 0,
                             master=['localhost:9005'])},
     [], ['TF_CONFIG', 'needs jobs ps and worker']),
    ({'TF_CONFIG': tf_config([9001], [9002], 'worker', 0,
                             chief=['localhost:9005', 'localhost:9006'])},
     [], ['TF_CONFIG: 2 chief tasks: a cluster has one at most']),
    ({'TF_CONFIG': '{"cluster": '}, [], ['TF_CONFIG']),
    ({}, [], ['--job_name is required']),
]


@pytest.mark.parametrize('env, args, words', SOURCE_ERRORS)
def test_cluster_source_errors(env, args, words, monkeypatch, capsys):
    line = usage_error(args, env, monkeypatch, capsys)
    for word in words:
        assert word in line


@pytest.mark.parametrize('job, index, task', [
    ('chief', 0, ('worker', 0)), ('worker', 1, ('worker', 2)),
    ('ps', 0, ('ps', 0)), ('evaluator', 0, ('evaluator', 0))])
def test_a_chief_job_is_worker_0_and_the_evaluator_no_task(monkeypatch, job,
                                                           index, task):
    monkeypatch.setenv('TF_CONFIG', tf_config_of([1, 2, 3, 4], job, index,
                                                 chief=True))
    cluster, *found = sources.from_tf_config()
    assert cluster.as_dict() == {
        'ps': ['localhost:1'],
        'worker': ['localhost:2', 'localhost:3', 'localhost:4']}
    assert tuple(found) == task
