"""Every task ends, on time: start order, lost tasks, bad input."""

import os
import shutil
import signal
import socket
import sys
import time

import pytest

from conftest import final_accuracies, left_running, listening, own_lines

# Long enough to be killed mid-run: 10 steps an epoch on the small data.
LONG_RUN = ['--epochs=300', '--print_every_epochs=1', '--validation_size=100']
SHORT_RUN = ['--epochs=2', '--validation_size=100']


def assert_clean_exit(procs, proc, status):
    output = procs.output(proc)
    assert proc.returncode == status, output
    assert 'Traceback' not in output
    assert left_running(proc) == []
    return output


def assert_one_error_line(procs, proc, status, *words):
    """Exit status, one line of our own on stderr naming the problem, no
    traceback, nothing left running."""
    output = assert_clean_exit(procs, proc, status)
    lines = own_lines(procs.stderr(proc))
    assert len(lines) == 1, output
    assert ': error: ' in lines[0]
    for word in words:
        assert word in lines[0]
    return lines[0]


@pytest.mark.parametrize('script', ['async', 'sync'])
def test_any_start_order(procs, free_ports, small_data, script):
    # Workers before the ps, the chief last; the ps 3 s later.
    ports = free_ports(4)
    flags = ['--data_dir=' + small_data] + SHORT_RUN
    workers = [None] * 3
    for i in (2, 1, 0):
        workers[i] = procs.script(script, 'worker', i, ports[:1], ports[1:],
                                  *flags)
        time.sleep(1)
    time.sleep(2)
    ps = procs.script(script, 'ps', 0, ports[:1], ports[1:], *flags)
    procs.wait_all(workers + [ps], 120)
    for i, worker in enumerate(workers):
        assert i in final_accuracies(assert_clean_exit(procs, worker, 0))
    assert_clean_exit(procs, ps, 0)


@pytest.mark.parametrize('script', ['async', 'sync'])
def test_backup_workers_and_repeats(procs, free_ports, small_data, script):
    """Back to back short runs, sync ones with and without a backup worker:
    every task of every run ends, no hang."""
    for run in range(5):
        flags = ['--data_dir=' + small_data] + SHORT_RUN
        if script == 'sync' and run % 2:
            flags.append('--replicas_to_aggregate=2')
        ps, workers = procs.cluster(script, free_ports, *flags)
        procs.wait_all(workers + [ps], 90)
        for i, worker in enumerate(workers):
            output = assert_clean_exit(procs, worker, 0)
            assert i in final_accuracies(output), (run, flags, output)
        assert_clean_exit(procs, ps, 0)


def test_killed_worker_does_not_stop_async_training(procs, free_ports,
                                                     small_data):
    ps, workers = procs.cluster('async', free_ports,
                                '--data_dir=' + small_data, *LONG_RUN[1:],
                                '--epochs=100')
    procs.wait_for_output(workers[2], r'^worker=2,epoch=1,', 60)
    os.kill(workers[2].pid, signal.SIGKILL)
    procs.wait_all(workers + [ps], 120)
    for i in (0, 1):
        output = assert_clean_exit(procs, workers[i], 0)
        assert i in final_accuracies(output)
    assert workers[2].returncode == -signal.SIGKILL
    assert_clean_exit(procs, ps, 0)


@pytest.mark.parametrize('script', ['async', 'sync'])
def test_lost_ps_ends_every_worker(procs, free_ports, small_data, script):
    ps, workers = procs.cluster(script, free_ports,
                                '--data_dir=' + small_data, *LONG_RUN)
    for i, worker in enumerate(workers):
        procs.wait_for_output(worker, r'^worker=%d,epoch=' % i, 60)
    os.kill(ps.pid, signal.SIGKILL)
    procs.wait_all(workers, 30)
    for i, worker in enumerate(workers):
        # TensorFlow logs the broken connection too; ours is the last line.
        assert_clean_exit(procs, worker, 1)
        last = procs.stderr(worker).splitlines()[-1]
        assert last == ('/job:worker/task:%d: error: lost the connection to '
                        '/job:ps/task:0 (localhost:%d)'
                        % (i, int(ps.args[4].rsplit(':', 1)[1])))


def test_missing_ps_ends_worker_after_startup_timeout(procs, free_ports,
                                                      small_data):
    ports = free_ports(4)
    worker = procs.script('async', 'worker', 1, ports[:1], ports[1:],
                          '--data_dir=' + small_data, '--startup_timeout=3',
                          *SHORT_RUN)
    procs.wait_all([worker], 60)
    assert_one_error_line(procs, worker, 1, '/job:ps/task:0',
                          'did not come up within 3 s')


def test_missing_chief_ends_worker_and_ps(procs, free_ports, small_data):
    ports = free_ports(4)
    flags = ['--data_dir=' + small_data, '--startup_timeout=5'] + SHORT_RUN
    ps = procs.script('async', 'ps', 0, ports[:1], ports[1:], *flags)
    worker = procs.script('async', 'worker', 1, ports[:1], ports[1:], *flags)
    procs.wait_all([worker, ps], 60)
    assert_one_error_line(procs, worker, 1, 'the chief',
                          'did not initialize the model within 5 s')
    assert_one_error_line(procs, ps, 1, '/job:worker/task:0',
                          'did not come up within 5 s')


def test_port_in_use(procs, free_ports, small_data):
    ports = free_ports(4)
    with socket.socket() as holder:
        holder.bind(('', ports[0]))
        holder.listen()
        ps = procs.script('async', 'ps', 0, ports[:1], ports[1:])
        procs.wait_all([ps], 60)
    assert_one_error_line(procs, ps, 1, 'port %d' % ports[0], 'in use')


CLUSTER = ['--ps=localhost:9001', '--worker=localhost:9002,localhost:9003']


@pytest.mark.parametrize('args, words', [
    (['--job_name=worker', '--ps=localhost', '--worker=localhost:9002'],
     ['--ps', "'localhost' is not host:port"]),
    (['--job_name=worker', '--ps=localhost:9001',
      '--worker=localhost:9002,,localhost:9003'], ['--worker']),
    (['--job_name=worker', '--ps=localhost:9001',
      '--worker=localhost:9002,localhost:9001'],
     ['localhost:9001 is given to two tasks']),
    (['--job_name=worker', '--task_index=2'] + CLUSTER,
     ['--task_index=2', 'only 2 worker task(s)']),
    (['--job_name=chief'] + CLUSTER, ['--job_name']),
    ([] + CLUSTER, ['--job_name']),
    (['--job_name=worker', '--batch_size=0'] + CLUSTER, ['batch_size']),
    (['--job_name=worker', '--epochs=-1'] + CLUSTER, ['epochs']),
    (['--job_name=worker', '--learning_rate=0'] + CLUSTER,
     ['learning_rate', 'must be positive']),
    (['--job_name=worker', '--task_index=x'] + CLUSTER, ['task_index']),
])
def test_usage_errors(procs, args, words):
    proc = procs.start([sys.executable, 'mnist_dist_async.py'] + args,
                       'bad')
    procs.wait_all([proc], 60)
    assert_one_error_line(procs, proc, 2, *words)


def break_truncate(path):
    data = open(path, 'rb').read()
    open(path, 'wb').write(data[:len(data) // 3])


def break_corrupt(path):
    data = bytearray(open(path, 'rb').read())
    data[len(data) // 2:len(data) // 2 + 64] = bytes(64)
    open(path, 'wb').write(bytes(data))


@pytest.mark.parametrize('damage, flags, words', [
    (os.remove, [], ['t10k-labels-idx1-ubyte.gz']),
    (break_truncate, [], ['t10k-labels-idx1-ubyte.gz', 'corrupt']),
    (break_corrupt, [], ['t10k-labels-idx1-ubyte.gz', 'corrupt']),
    (None, ['--validation_size=2000'],
     ['1100 training images', '--validation_size=2000']),
])
def test_data_errors(procs, free_ports, small_data, tmp_path, damage, flags,
                     words):
    data = shutil.copytree(small_data, str(tmp_path / 'data'))
    if damage:
        damage(os.path.join(data, 't10k-labels-idx1-ubyte.gz'))
    ports = free_ports(2)
    worker = procs.script('async', 'worker', 0, ports[:1], ports[1:],
                          '--data_dir=' + data, *SHORT_RUN, *flags)
    procs.wait_all([worker], 60)
    assert_one_error_line(procs, worker, 1, *words)
