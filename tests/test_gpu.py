"""The scripts on a machine with a GPU, as launch_local.sh runs them: 8
async workers on one GPU, sync 1 ps + 3 workers, TF2 1 ps + 3 workers.
Each worker holds GPU:0 (TensorFlow's own `Created device` line), the ps
tasks and TF2's coordinator no GPU, and every task ends 0. Skipped where
no NVIDIA GPU is found; the session configs behind it are tested
everywhere (test_server.py)."""

import glob
import os
import re
import sys

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
                     r'(, on GPU 0 of \d+)?$', re.M)


def launch(procs, tmp_path, free_port_run, data, *args, workers=3):
    """A launch_local.sh run, on the host's network, that TensorFlow's
    device lines reach the logs of; returns (its output, {log name: its
    text})."""
    run_dir = tmp_path / args[0]
    base = free_port_run(1 + workers)
    # Python's own environment: the scripts set no TF_CPP_MIN_LOG_LEVEL
    # where one is set, and TensorFlow then logs the devices it creates.
    launcher = procs.start(
        ['env', 'PYTHON=' + sys.executable, 'TF_CPP_MIN_LOG_LEVEL=0',
         './launch_local.sh', '-H', '-n', str(workers), '-b', str(base),
         '-o', str(run_dir), *args, '--data_dir=' + data, '--epochs=3',
         '--validation_size=100'], 'launcher-' + args[0])
    procs.wait_all([launcher], START_UP * 2)
    output = procs.output(launcher)
    assert launcher.returncode == 0, output
    logs = {}
    for path in glob.glob(str(run_dir / '*.log')):
        with open(path) as f:
            logs[os.path.basename(path)[:-4]] = f.read()
    return output, logs


def assert_on_the_gpu(output, logs, workers, coordinator=False):
    """Every worker (but TF2's coordinator, worker 0) holds GPU:0 and said
    so, the ps and the coordinator hold none; every worker's summary line
    says exit 0 and its GPU."""
    summary = SUMMARY.findall(output)
    assert [(w, status) for w, status, _ in summary] == [
        (str(i), '0') for i in range(workers)], output
    for i in range(workers):
        log = logs['worker%d' % i]
        devices = CREATED.findall(log)
        if coordinator and i == 0:
            assert devices == [], log[-3000:]
            # Its first lines name it as the TF1 scripts' worker 0.
            assert '/job:worker/task:0: on the CPU: --gpu_jobs=worker' in log
            assert summary[i][2] == ''
        else:
            assert [name.rsplit('/', 1)[1] for name, _ in devices] == [
                'device:GPU:0'], log[-3000:]
            assert summary[i][2], output
    assert CREATED.findall(logs['ps0']) == []


def test_eight_async_workers_share_one_gpu(procs, tmp_path, free_port_run,
                                           small_data):
    output, logs = launch(procs, tmp_path, free_port_run, small_data,
                          'async', workers=8)
    assert_on_the_gpu(output, logs, 8)
    assert len(final_accuracies(output)) == 8


def test_sync_on_a_gpu(procs, tmp_path, free_port_run, small_data):
    output, logs = launch(procs, tmp_path, free_port_run, small_data, 'sync')
    assert_on_the_gpu(output, logs, 3)
    assert len(final_accuracies(output)) == 3


def test_tf2_on_a_gpu(procs, tmp_path, free_port_run, small_data):
    output, logs = launch(procs, tmp_path, free_port_run, small_data, 'tf2')
    assert_on_the_gpu(output, logs, 3, coordinator=True)
    assert list(final_accuracies(output)) == [0]
