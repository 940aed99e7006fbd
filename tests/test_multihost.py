"""2 ps + 3 workers, each task on its own host: a network namespace with its
own address, all joined by a bridge, with added link delay. Root only."""

import os
import subprocess
import sys
import uuid

import pytest

from conftest import final_accuracies, left_running

pytestmark = pytest.mark.slow  # not in the fast tier

PORT = 2222
SUBNET = '10.213.%d.%d'


def ip(*args, netns=None):
    prefix = ['ip', 'netns', 'exec', netns] if netns else []
    subprocess.run(prefix + ['ip'] + list(args), check=True,
                   capture_output=True)


@pytest.fixture
def hosts():
    """hosts(n, delay_ms): n hosts, their links delayed by delay_ms where
    the kernel has netem; returns [(netns, address)]."""
    if os.geteuid() != 0:
        pytest.skip('network namespaces need root')
    made = []

    def make(n, delay_ms):
        tag = uuid.uuid4().hex[:6]
        hub = 'pshub-' + tag
        if subprocess.run(['ip', 'netns', 'add', hub]).returncode:
            pytest.skip('cannot make network namespaces here')
        made.append(hub)
        ip('link', 'add', 'br0', 'type', 'bridge', netns=hub)
        ip('link', 'set', 'br0', 'up', netns=hub)
        net = int(tag[:2], 16) % 250
        result = []
        for i in range(n):
            name, address = 'pshost%d-%s' % (i, tag), SUBNET % (net, i + 1)
            subprocess.run(['ip', 'netns', 'add', name], check=True)
            made.append(name)
            ip('link', 'add', 'h%d%s' % (i, tag), 'type', 'veth', 'peer',
               'name', 'b%d%s' % (i, tag))
            ip('link', 'set', 'h%d%s' % (i, tag), 'netns', name)
            ip('link', 'set', 'b%d%s' % (i, tag), 'netns', hub)
            ip('link', 'set', 'b%d%s' % (i, tag), 'master', 'br0', 'up',
               netns=hub)
            ip('addr', 'add', address + '/24', 'dev', 'h%d%s' % (i, tag),
               netns=name)
            ip('link', 'set', 'h%d%s' % (i, tag), 'up', netns=name)
            ip('link', 'set', 'lo', 'up', netns=name)
            if delay_ms:
                # Optional: some kernels have no netem (sch_netem).
                subprocess.run(['ip', 'netns', 'exec', name, 'tc', 'qdisc',
                                'add', 'dev', 'h%d%s' % (i, tag), 'root',
                                'netem', 'delay', '%dms' % delay_ms],
                               capture_output=True)
            result.append((name, address))
        return result

    yield make
    for name in made:
        subprocess.run(['ip', 'netns', 'del', name], capture_output=True)


@pytest.mark.parametrize('script', ['async', 'sync'])
def test_two_ps_three_workers_on_five_hosts(procs, hosts, small_data, script):
    machines = hosts(5, delay_ms=1)
    ps_hosts = ['%s:%d' % (address, PORT) for _, address in machines[:2]]
    worker_hosts = ['%s:%d' % (address, PORT) for _, address in machines[2:]]
    tasks = [('ps', i) for i in range(2)] + [('worker', i) for i in range(3)]
    started = []
    for (netns, _), (job, index) in zip(machines, tasks):
        started.append(procs.start(
            ['ip', 'netns', 'exec', netns, sys.executable,
             'mnist_dist_%s.py' % script, '--job_name=' + job,
             '--task_index=%d' % index, '--ps=' + ','.join(ps_hosts),
             '--worker=' + ','.join(worker_hosts), '--data_dir=' + small_data,
             '--validation_size=100', '--epochs=3', '--learning_rate=0.5'],
            '%s%d' % (job, index)))
    procs.wait_all(started, 180)
    for proc, (job, index) in zip(started, tasks):
        output = procs.output(proc)
        assert proc.returncode == 0, output
        assert 'Traceback' not in output
        assert left_running(proc) == []
        if job == 'worker':
            assert final_accuracies(output)[index] > 0.9, output
