"""The scripts on a machine with a GPU, as launch_local.sh runs them: 8
async workers on one GPU, with the book's --gpu_memory_fraction=0.2 and
without a cap; sync 1 ps + 3 workers; TF2 1 ps + 3 workers; on the
launcher's private network and on the host's. Each worker holds its GPU
(TensorFlow's own `Created device` line, and GPU memory as nvidia-smi
shows it by process), dealt round robin on a host of several; the ps tasks
and TF2's coordinator hold none; every task ends 0. In-process, the model's
products and their gradients run on the worker's GPU, the update on the ps.
Skipped where no NVIDIA GPU device exists; where one does but TensorFlow
cannot use it, each test fails saying TensorFlow's reason. The session
configs behind it are tested everywhere (test_server.py)."""

import glob
import os
import re
import subprocess
import sys
import threading

import pytest

from conftest import START_UP, final_accuracies

pytestmark = [
    pytest.mark.slow, pytest.mark.gpu, pytest.mark.xdist_group('real'),
    pytest.mark.skipif(not glob.glob('/dev/nvidia[0-9]*'),
                       reason='no NVIDIA GPU here (/dev/nvidia0, ...)')]

# TensorFlow's line as a task's server, or a process's eager runtime,
# takes a GPU.
CREATED = re.compile(r'Created device (\S+/device:GPU:\d+) with (\d+) MB '
                     r'memory')
SUMMARY = re.compile(r'^worker (\d+): exit (\d+)(?:, final accuracy = \S+)?'
                     r'(?:, on GPU (\d+) of (\d+))?$', re.M)


@pytest.fixture(scope='module')
def num_gpus():
    """The GPUs TensorFlow sees here; a failure, with TensorFlow's own
    reason, where it sees none beside a GPU device."""
    from ps_cluster import server
    ran = subprocess.run(
        [sys.executable, '-c', 'import tensorflow as tf; '
         'print(len(tf.config.list_physical_devices("GPU")))'],
        capture_output=True, text=True, timeout=START_UP,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'))
    count = int(ran.stdout.split()[-1]) if ran.returncode == 0 else 0
    if not count:
        pytest.fail('%s is here, but TensorFlow sees no GPU: %s' % (
            sorted(glob.glob('/dev/nvidia[0-9]*'))[0], server.why_no_gpu()))
    return count


def task_of(pid):
    """(job, task index) of a task's process, from its command line."""
    try:
        with open('/proc/%d/cmdline' % pid, 'rb') as f:
            argv = f.read().decode().split('\0')
    except OSError:
        return None
    flags = dict(arg[2:].split('=', 1) for arg in argv
                 if arg.startswith('--') and '=' in arg)
    return flags.get('job_name'), int(flags.get('task_index', 0))


def gpu_holders(stop, held):
    """Adds to `held` each (job, index) whose process holds GPU memory,
    as nvidia-smi lists compute processes, until stop is set."""
    while not stop.wait(0.5):
        listed = subprocess.run(
            ['nvidia-smi', '--query-compute-apps=pid', '--format=csv,noheader'],
            capture_output=True, text=True)
        for pid in listed.stdout.split():
            task = task_of(int(pid))
            if task:
                held.add(task)


def launch(procs, tmp_path, free_port_run, data, *args, workers=3,
           host_network=True):
    """A launch_local.sh run, on the host's network or the launcher's own,
    that TensorFlow's device lines reach the logs of; returns (its output,
    {log name: its text}, the tasks that held GPU memory)."""
    run_dir = tmp_path / ('%s-%d' % (args[0], len(os.listdir(tmp_path))))
    base = free_port_run(1 + workers)
    stop, held = threading.Event(), set()
    watch = threading.Thread(target=gpu_holders, args=(stop, held))
    watch.start()
    # Python's own environment: the scripts set no TF_CPP_MIN_LOG_LEVEL
    # where one is set, and TensorFlow then logs the devices it creates.
    launcher = procs.start(
        ['env', 'PYTHON=' + sys.executable, 'TF_CPP_MIN_LOG_LEVEL=0',
         './launch_local.sh', *(['-H'] if host_network else []), '-n',
         str(workers), '-b', str(base), '-o', str(run_dir), *args,
         '--data_dir=' + data, '--epochs=3', '--validation_size=100'],
        'launcher-%s' % run_dir.name)
    try:
        procs.wait_all([launcher], START_UP * 2)
    finally:
        stop.set()
        watch.join()
    output = procs.output(launcher)
    assert launcher.returncode == 0, output
    logs = {}
    for path in glob.glob(str(run_dir / '*.log')):
        with open(path) as f:
            logs[os.path.basename(path)[:-4]] = f.read()
    return output, logs, held


def assert_on_the_gpus(output, logs, held, workers, num_gpus,
                       coordinator=False):
    """Every worker (but TF2's coordinator, worker 0) holds the GPU it was
    dealt, round robin over the host's, said so, and held its memory; the
    ps and the coordinator hold none; every worker's summary line says exit
    0 and its GPU."""
    summary = SUMMARY.findall(output)
    assert [(w, status) for w, status, _, _ in summary] == [
        (str(i), '0') for i in range(workers)], output
    users = [i for i in range(workers) if not (coordinator and i == 0)]
    for i in range(workers):
        log = logs['worker%d' % i]
        devices = CREATED.findall(log)
        if i not in users:
            assert devices == [], log[-3000:]
            # Its first lines name it as the TF1 scripts' worker 0.
            assert '/job:worker/task:0: on the CPU: --gpu_jobs=worker' in log
            assert summary[i][2] == ''
        else:
            # Each sees its own GPU alone, as GPU:0 of its server.
            assert [name.rsplit('/', 1)[1] for name, _ in devices] == [
                'device:GPU:0'], log[-3000:]
            assert summary[i][2:] == (str(users.index(i) % num_gpus),
                                      str(num_gpus)), output
    assert CREATED.findall(logs['ps0']) == []
    assert held == {('worker', i) for i in users}, held


def test_eight_async_workers_share_one_gpu(procs, tmp_path, free_port_run,
                                           small_data, num_gpus):
    # With no cap, and with the book's 0.2 a worker, which 8 on one GPU
    # exceed: each grows into what it needs, below its cap.
    for cap in ([], ['--gpu_memory_fraction=0.2']):
        output, logs, held = launch(procs, tmp_path, free_port_run,
                                    small_data, 'async', *cap, workers=8)
        assert_on_the_gpus(output, logs, held, 8, num_gpus)
        assert len(final_accuracies(output)) == 8


def test_sync_on_a_gpu(procs, tmp_path, free_port_run, small_data, num_gpus):
    output, logs, held = launch(procs, tmp_path, free_port_run, small_data,
                                'sync')
    assert_on_the_gpus(output, logs, held, 3, num_gpus)
    assert len(final_accuracies(output)) == 3


def test_tf2_on_a_gpu(procs, tmp_path, free_port_run, small_data, num_gpus):
    output, logs, held = launch(procs, tmp_path, free_port_run, small_data,
                                'tf2')
    assert_on_the_gpus(output, logs, held, 3, num_gpus, coordinator=True)
    assert list(final_accuracies(output)) == [0]


def test_the_launchers_own_network_on_a_gpu(procs, tmp_path, free_port_run,
                                            small_data, num_gpus):
    # launch_local.sh's default: the tasks in a private network namespace.
    output, logs, held = launch(procs, tmp_path, free_port_run, small_data,
                                'async', host_network=False)
    assert_on_the_gpus(output, logs, held, 3, num_gpus)


PLACED = '''
import os, sys
import tensorflow.compat.v1 as tf
tf.disable_v2_behavior()
import mnist_dist_async
from ps_cluster import server
ps, worker = sys.argv[1:]
cluster = tf.train.ClusterSpec({'ps': [ps], 'worker': [worker]})
servers = [tf.train.Server(cluster, job_name=job, task_index=0,
                           config=server.session_config(job, 0, gpu=gpu))
           for job, gpu in (('ps', None), ('worker', 0))]
with tf.device(tf.train.replica_device_setter(
        worker_device='/job:worker/task:0', cluster=cluster)):
    x = tf.placeholder(tf.float32, [None, 784])
    y = tf.placeholder(tf.float32, [None, 10])
    loss, _ = mnist_dist_async.loss_and_accuracy(mnist_dist_async.model(x), y)
    step = tf.train.get_or_create_global_step()
    train = tf.train.GradientDescentOptimizer(0.1).minimize(loss, step)
config = server.session_config('worker', 0, gpu=0)
with tf.Session(servers[1].target, config=config) as sess:
    sess.run(tf.global_variables_initializer())
    metadata = tf.RunMetadata()
    sess.run(train, {x: [[0.0] * 784], y: [[1.0] + [0.0] * 9]},
             options=tf.RunOptions(trace_level=tf.RunOptions.FULL_TRACE),
             run_metadata=metadata)
for device in metadata.step_stats.dev_stats:
    for node in device.node_stats:
        print(device.device, node.node_name)
'''


def test_the_model_computes_on_the_workers_gpu(free_ports, num_gpus):
    # The product of the images and w, and the gradients' products, on the
    # worker's GPU; the update, where w lies, on the ps, which has none.
    ps, worker = ('localhost:%d' % port for port in free_ports(2))
    ran = subprocess.run([sys.executable, '-c', PLACED, ps, worker],
                         capture_output=True, text=True, timeout=START_UP)
    assert ran.returncode == 0, ran.stderr
    placed = [line.split() for line in ran.stdout.splitlines()]
    products = {device for device, node in placed if 'MatMul' in node}
    assert products == {'/job:worker/replica:0/task:0/device:GPU:0'}, placed
    updates = {device for device, node in placed
               if 'ApplyGradientDescent' in node}
    assert updates and all(device.startswith('/job:ps/') and 'GPU' not in
                           device for device in updates), placed
