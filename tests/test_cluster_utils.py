"""What the scripts call in cluster_utils.py, as a user meets it: usage
errors (in this process, and two in runs of their own), data errors, a port
in use, --shard_data, an earlier run's end marker; and the straggler's
gradients as TensorFlow runs them."""

import contextlib
import os
import re
import shutil
import signal
import socket
import sys

import pytest
import tensorflow.compat.v1 as tf

from conftest import (SHORT_RUN, START_UP, assert_clean_exit,
                      assert_one_error_line, final_accuracies, own_lines)

from ps_counters import on_ps
from script_flags import usage_error
import cluster_utils
import small_model
from ps_cluster import exits
from ps_cluster.deadlines import poll


@pytest.mark.slow
def test_port_in_use(procs, free_ports, small_data):
    ports = free_ports(4)
    with socket.socket() as holder:
        holder.bind(('', ports[0]))
        holder.listen()
        ps = procs.script('async', 'ps', 0, ports[:1], ports[1:])
        procs.wait_all([ps], START_UP)
    assert_one_error_line(procs, ps, 1, 'port %d' % ports[0], 'in use')


CLUSTER = ['--ps=localhost:9001', '--worker=localhost:9002,localhost:9003']


# A mistake of the cluster's and one of a flag's: the runs below meet them.
TOO_FEW_WORKERS = (['--job_name=worker', '--task_index=2'] + CLUSTER,
                   ['--task_index=2', 'only 2 worker task(s)'])
NO_SUCH_JOB = (['--job_name=chief'] + CLUSTER, ['--job_name'])
USAGE_ERRORS = [
    (['--job_name=worker', '--ps=localhost', '--worker=localhost:9002'],
     ['--ps', "'localhost' is not host:port"]),
    (['--job_name=worker', '--ps=localhost:9001',
      '--worker=localhost:9002,,localhost:9003'], ['--worker']),
    (['--job_name=worker', '--ps=localhost:9001',
      '--worker=localhost:9002,localhost:9001'],
     ['localhost:9001 is given to two tasks']),
    TOO_FEW_WORKERS,
    NO_SUCH_JOB,
    ([] + CLUSTER, ['--job_name']),
    (['--job_name=worker', '--batch_size=0'] + CLUSTER, ['batch_size']),
    (['--job_name=worker', '--epochs=-1'] + CLUSTER, ['epochs']),
    (['--job_name=worker', '--learning_rate=0'] + CLUSTER,
     ['learning_rate', 'must be positive']),
    (['--job_name=worker', '--task_index=x'] + CLUSTER, ['task_index']),
    (['--job_name=worker', '--gpu_jobs=worker,gpu'] + CLUSTER,
     ['--gpu_jobs', 'worker, ps, evaluator, coordinator']),
    (['--job_name=worker', '--gpu_memory_fraction=1.5'] + CLUSTER,
     ['--gpu_memory_fraction', 'must be in (0, 1]']),
    (['--job_name=worker', '--min_workers=3'] + CLUSTER,
     ['--min_workers=3, but the cluster lists 2 workers']),
]


@pytest.mark.parametrize('args, words', USAGE_ERRORS)
def test_usage_errors(args, words, monkeypatch, capsys):
    line = usage_error(args, {}, monkeypatch, capsys)
    for word in words:
        assert word in line


@pytest.mark.slow
@pytest.mark.xdist_group('real')  # real processes (pytest.ini)
def test_usage_errors_as_a_run_meets_them(procs):
    # Each in a process of its own: one line, exit status 2, nothing left
    # running.
    # Sync cannot be elastic below what it aggregates, nor TensorFlow 2's
    # cluster at all.
    cases = [('async', *TOO_FEW_WORKERS), ('async', *NO_SUCH_JOB),
             ('sync', ['--job_name=worker', '--min_workers=1'] + CLUSTER,
              ['--min_workers=1 is below the 2 gradients each sync update '
               'aggregates (--replicas_to_aggregate)']),
             ('sync', ['--job_name=ps', '--replicas_to_aggregate=3'] + CLUSTER,
              ['--replicas_to_aggregate=3 is above the 2 workers listed']),
             ('tf2', ['--job_name=ps', '--min_workers=1'] + CLUSTER,
              ["--min_workers: TensorFlow 2's coordinator connects to every "
               'listed worker as it starts'])]
    bad = [procs.start([sys.executable, 'mnist_dist_%s.py' % script] + args,
                       'bad%d' % n) for n, (script, args, _) in
           enumerate(cases)]
    procs.wait_all(bad, START_UP)
    for proc, (_, args, words) in zip(bad, cases):
        assert_one_error_line(procs, proc, 2, *words)


def test_a_task_that_cannot_use_its_gpu_says_which_and_how_much(
        shared_cluster, monkeypatch, capsys):
    spec = shared_cluster()
    monkeypatch.setattr(sys, 'argv', [
        'mnist_dist_async.py', '--job_name=ps', '--task_index=0',
        '--ps=' + ','.join(spec.job_tasks('ps')),
        '--worker=' + ','.join(spec.job_tasks('worker')),
        '--gpu_jobs=ps,worker', '--gpu_memory_fraction=0.25'])
    try:
        cluster_utils.parse_flags(sys.argv)
        task = cluster_utils.this_task(False, exits.TaskEnd(lambda: 'unused'))
        # Dealt GPU 0, as on a host with one; its server, like every
        # server of these tests, keeps off the GPUs: its product fails.
        task.gpu.index = 0
        with pytest.raises(exits.TaskFailed) as failed:
            task.gpu.check(small_model.server(spec, 'ps', 0), task.config,
                           'ps', 0)
        lines = capsys.readouterr().out
        # A GPU's own failure, in TensorFlow's words as a server makes its
        # context; and an error that is none.
        task.gpu.name = 'NVIDIA H200'
        own = task.gpu.line(tf.errors.InternalError(
            None, None, 'CUDA runtime implicit initialization on GPU:0 '
            'failed. Status: out of memory'))
        other = task.gpu.line(tf.errors.UnavailableError(
            None, None, 'Socket closed'))
    finally:
        cluster_utils.FLAGS.unparse_flags()
    # None of a GPU's own failures: TensorFlow's line, the cap it asked
    # for, and the way out.
    assert re.fullmatch(
        r'cannot use GPU 0: Cannot assign a device for operation .+; it '
        r'asked for at most 0\.25 of its memory \(--gpu_memory_fraction\): '
        r'keep the ps tasks off the GPUs \(--gpu_jobs\)',
        failed.value.message), failed.value.message
    assert own == (
        'cannot use GPU 0 (NVIDIA H200): out of memory (CUDA runtime '
        'implicit initialization on GPU:0 failed. Status: out of memory); it '
        'asked for at most 0.25 of its memory (--gpu_memory_fraction): fewer '
        'tasks a GPU (each holds a CUDA context of some hundreds of MB), or '
        'a cap on each (--gpu_memory_fraction)')
    assert other is None
    # Its first lines said where it would compute.
    assert re.search(r'^/job:ps/task:0: on (the CPU: no GPU found|GPU \d+ '
                     r'of \d+, GPU task 1 of 3 on localhost; memory as it '
                     r'needs it, at most 0.25 of it '
                     r'\(--gpu_memory_fraction\))$', lines, re.M)


@pytest.mark.slow
def test_a_gpu_given_that_tensorflow_cannot_use_ends_the_worker(
        procs, free_ports, small_data):
    # Worker 1 was given GPU 0, as Kubernetes' device plugin gives one, in
    # an image without CUDA (this host has no GPU at all): it ends at once,
    # saying TensorFlow's reason and the ways out, and the cluster hears
    # why. With --gpu_jobs= it trains on the CPU.
    runs = {}
    for name, more in (('given-', []), ('cpu-', ['--gpu_jobs='])):
        ports = free_ports(3)
        flags = ['--ps=localhost:%d' % ports[0], '--worker=localhost:%d,'
                 'localhost:%d' % tuple(ports[1:]), '--data_dir=' + small_data,
                 *SHORT_RUN, *more]
        runs[name] = [procs.forked(
            'mnist_dist_async.py', ['--job_name=%s' % job,
                                    '--task_index=%d' % i, *flags],
            '%s%s%d' % (name, job, i),
            env={'NVIDIA_VISIBLE_DEVICES': '0'} if i == 1 else None)
            for job, i in (('ps', 0), ('worker', 0), ('worker', 1))]
    ps, chief, worker = runs['given-']
    procs.wait_all([worker], START_UP)
    line = assert_one_error_line(
        procs, worker, 1, 'given a GPU (NVIDIA_VISIBLE_DEVICES=0) that '
        'TensorFlow cannot use: ', '. Use an image with CUDA (the '
        'Dockerfile\'s --build-arg TF_EXTRAS=and-cuda) or pip install '
        '\'tensorflow[and-cuda]\', or train on the CPU: --gpu_jobs=')
    procs.wait_all(runs['given-'] + runs['cpu-'], START_UP)
    reason = line.split(': error: ', 1)[1]
    assert ('"%s"' % reason) in assert_clean_exit(procs, ps, 0)
    assert 0 in final_accuracies(assert_clean_exit(procs, chief, 0))
    for task in runs['cpu-']:
        assert_clean_exit(procs, task, 0)
    assert ('/job:worker/task:1: on the CPU: --gpu_jobs=' in
            procs.output(runs['cpu-'][2]))
    assert 1 in final_accuracies(procs.output(runs['cpu-'][2]))


def break_truncate(path):
    data = open(path, 'rb').read()
    open(path, 'wb').write(data[:len(data) // 3])


def break_corrupt(path):
    data = bytearray(open(path, 'rb').read())
    data[len(data) // 2:len(data) // 2 + 64] = bytes(64)
    open(path, 'wb').write(bytes(data))


DATA_ERRORS = [
    (os.remove, [], ['t10k-labels-idx1-ubyte.gz']),
    (break_truncate, [], ['t10k-labels-idx1-ubyte.gz', 'corrupt']),
    (break_corrupt, [], ['t10k-labels-idx1-ubyte.gz', 'corrupt']),
    (None, ['--validation_size=2000'],
     ['1100 training images', '--validation_size=2000']),
]


@pytest.mark.slow
def test_data_errors(procs, free_ports, small_data, tmp_path):
    # A chief for each, all at once.
    chiefs = []
    for n, (damage, flags, _) in enumerate(DATA_ERRORS):
        data = shutil.copytree(small_data, str(tmp_path / ('data%d' % n)))
        if damage:
            damage(os.path.join(data, 't10k-labels-idx1-ubyte.gz'))
        ports = free_ports(2)
        chiefs.append(procs.script('async', 'worker', 0, ports[:1],
                                   ports[1:], '--data_dir=' + data,
                                   *SHORT_RUN, *flags, name='data%d' % n))
    procs.wait_all(chiefs, START_UP)
    for chief, (_, _, words) in zip(chiefs, DATA_ERRORS):
        assert_one_error_line(procs, chief, 1, *words)


@pytest.mark.slow
def test_shard_data(procs, free_ports, small_data):
    # 1,000 training images: each of 3 workers walks its own 334 or 333,
    # 3 batches of 100 an epoch.
    ps, workers = procs.cluster('async', free_ports, '--data_dir=' + small_data,
                                '--validation_size=100', '--epochs=3',
                                '--shard_data', '--print_every_epochs=1')
    procs.wait_all(workers + [ps], START_UP)
    for i, worker in enumerate(workers):
        output = assert_clean_exit(procs, worker, 0)
        local_steps = re.findall(r'^worker=%d,epoch=\d+,global_step=\d+, '
                                 r'local_step=(\d+),' % i, output, re.M)
        assert local_steps == ['3', '6', '9']


def test_a_stragglers_gradients_start_after_its_read_of_the_step():
    # As TensorFlow runs the graph, after grappler: every op of the update
    # comes after the read that says whether an update passed it.
    with tf.Graph().as_default():
        global_step = tf.train.get_or_create_global_step()
        w = tf.Variable([1.0, 2.0])
        slow, step_read = cluster_utils.slow_gradients(1, global_step)
        train_op = tf.train.GradientDescentOptimizer(0.1).minimize(
            tf.reduce_mean(w * w), global_step=global_step, grad_loss=slow)
        metadata = tf.RunMetadata()
        with tf.Session() as sess:
            sess.run(tf.global_variables_initializer())
            assert sess.run([train_op, step_read], options=tf.RunOptions(
                output_partition_graphs=True), run_metadata=metadata)[1] == 0
    inputs = {node.name: [name.lstrip('^').split(':')[0]
                          for name in node.input]
              for graph in metadata.partition_graphs for node in graph.node}
    updates = [name for name in inputs if 'ApplyGradientDescent' in name]
    before, todo = set(), list(updates)
    while todo:
        name = todo.pop()
        if name not in before:
            before.add(name)
            todo.extend(inputs[name])
    assert len(updates) == 1 and step_read.op.name in before


@pytest.mark.slow
@pytest.mark.parametrize('end, status, lines', [
    # A thread that fails, which no session's coordinator stores: the task
    # cannot go on without it.
    ('thread', 1, ['/job:ps/task:0: error: a thread failed: division by '
                   'zero']),
    # An error of another kind than ours or TensorFlow's, as TensorFlow's
    # SessionManager raises one.
    ('raise', 1, ['/job:ps/task:0: error: RuntimeError: Init operations did '
                  'not make model ready']),
    # TensorFlow's own objects, collected after a lost task, raise its
    # error again: the task's own line says it; anything else, in a line.
    ('collected', 0, ["/job:ps/task:0: ignored in Raises.__del__: no lost "
                      "task's",
                      '/job:ps/task:0: ignored in Raises.__del__: not ours '
                      'to end on']),
])
def test_what_no_thread_or_object_can_raise_ends_in_one_line(
        procs, free_ports, end, status, lines):
    task = procs.forked('tests/task_ends.py', [
        '--job_name=ps', '--ps=localhost:%d' % free_ports(1)[0], end], end)
    procs.wait_all([task], START_UP)
    assert_clean_exit(procs, task, status)
    assert own_lines(procs.stderr(task)) == lines


@pytest.mark.slow
@pytest.mark.parametrize('end, last', [
    ('thread', 'a thread failed: division by zero'),
    ('raise', 'RuntimeError: Init operations did not make model ready')])
def test_tracebacks_prints_where_above_the_line(procs, free_ports, end, last):
    task = procs.forked('tests/task_ends.py', [
        '--job_name=ps', '--ps=localhost:%d' % free_ports(1)[0],
        '--tracebacks', end], end)
    procs.wait_all([task], START_UP)
    lines = own_lines(procs.stderr(task))
    assert task.returncode == 1
    assert lines[0] == 'Traceback (most recent call last):'
    assert any('task_ends.py' in line for line in lines)
    assert lines[-1] == '/job:ps/task:0: error: ' + last


def wait_for_the_first_beat(worker, ports):
    """Until worker 1's first beat is on ps 0 (at ports[0]), or it ended."""
    cluster = tf.train.ClusterSpec({
        'ps': ['localhost:%d' % ports[0]],
        'worker': ['localhost:%d' % port for port in ports[1:]]})

    def came():
        with contextlib.suppress(tf.errors.OpError):
            return worker.poll() is not None or on_ps(
                cluster, 0, lambda beats, *_: beats)[1] > 0
    assert poll(came, START_UP, 0.2)


@pytest.mark.slow
@pytest.mark.xdist_group('real')  # real processes (pytest.ini)
def test_an_earlier_runs_end_marker_ends_no_worker_of_a_new_run(
        procs, free_ports, small_data, tmp_path):
    # An elastic run's logdir still holds the marker of an earlier run's
    # end, which this run's chief removes as it starts: worker 1 comes
    # before the chief, its ps up, and trains instead of ending 0 (the
    # chief's steps slow enough for it to join: 8 s of them alone).
    logdir = tmp_path / 'logdir'
    logdir.mkdir()
    (logdir / 'chief_done').write_text('1000000')
    ports = free_ports(3)
    flags = ['--data_dir=' + small_data, '--logdir=%s' % logdir,
             '--min_workers=1', '--step_delay_ms=200', *SHORT_RUN]
    ps = procs.script('async', 'ps', 0, ports[:1], ports[1:], *flags)
    procs.wait_for_output(ps, r'serving until', START_UP)
    worker = procs.script('async', 'worker', 1, ports[:1], ports[1:], *flags)
    wait_for_the_first_beat(worker, ports)
    chief = procs.script('async', 'worker', 0, ports[:1], ports[1:], *flags)
    procs.wait_all([chief, worker, ps], START_UP)
    for task in (chief, worker):
        output = assert_clean_exit(procs, task, 0)
        assert 'global_step=1000000' not in output
        assert final_accuracies(output), output


@pytest.mark.slow
@pytest.mark.xdist_group('real')  # real processes (pytest.ini)
def test_a_ps_lost_as_an_elastic_worker_starts_is_no_end_of_the_run(
        procs, free_ports, small_data):
    # Worker 1 of an elastic run came, and waits for the chief's model,
    # when its ps is lost: its line names the ps, and does not guess that
    # the run may have ended (a ps that never came up might say so).
    ports = free_ports(3)
    flags = ['--data_dir=' + small_data, '--min_workers=1',
             '--ps_timeout=1', *SHORT_RUN]
    ps = procs.script('async', 'ps', 0, ports[:1], ports[1:], *flags)
    procs.wait_for_output(ps, r'serving until', START_UP)
    worker = procs.script('async', 'worker', 1, ports[:1], ports[1:], *flags)
    wait_for_the_first_beat(worker, ports)
    os.kill(ps.pid, signal.SIGKILL)
    procs.wait_all([worker], START_UP)
    line = assert_one_error_line(procs, worker, 1,
                                 '/job:ps/task:0 (localhost:%d)' % ports[0])
    assert 'the run may have ended' not in line
