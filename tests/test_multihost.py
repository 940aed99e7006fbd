"""2 ps + 3 workers, each task on its own host: a network namespace with its
own address, all joined by a bridge, with added link delay. Root only. The
workers say where round robin put the model."""

import contextlib

import pytest

from conftest import (assert_clean_exit, final_accuracies, network_hosts,
                      run_accuracy)

pytestmark = pytest.mark.slow  # not in the fast tier

PORT = 2222


@pytest.fixture
def hosts():
    """hosts(n, delay_ms): n hosts, their links delayed by delay_ms where
    the kernel has netem; returns [(netns, address)]."""
    with contextlib.ExitStack() as stack:
        yield lambda n, delay_ms: stack.enter_context(
            network_hosts(n, delay_ms))[1]


@pytest.mark.parametrize('script', ['async', 'sync'])
def test_two_ps_three_workers_on_five_hosts(procs, hosts, small_data, script):
    machines = hosts(5, delay_ms=1)
    ps_hosts = ['%s:%d' % (address, PORT) for _, address in machines[:2]]
    worker_hosts = ['%s:%d' % (address, PORT) for _, address in machines[2:]]
    tasks = [('ps', i) for i in range(2)] + [('worker', i) for i in range(3)]
    started = []
    for (netns, _), (job, index) in zip(machines, tasks):
        started.append(procs.forked(
            'mnist_dist_%s.py' % script,
            ['--job_name=' + job, '--task_index=%d' % index,
             '--ps=' + ','.join(ps_hosts), '--worker=' + ','.join(worker_hosts),
             '--data_dir=' + small_data, '--validation_size=100',
             '--epochs=3', '--learning_rate=0.5'],
            '%s%d' % (job, index), netns=netns))
    procs.wait_all(started, 180)
    outputs = [assert_clean_exit(procs, proc, 0) for proc in started]
    for output, (job, index) in zip(outputs, tasks):
        if job == 'worker':
            assert index in final_accuracies(output), output
            # Round robin: ps 1 holds w, 99.8% of the model's bytes.
            assert '/job:ps/task:1 (%s) holds w: 31,360 bytes, 99.8%% of ' \
                'the model' % ps_hosts[1] in output, output
    assert run_accuracy(outputs[2:], script) > 0.9
