"""A ps task that goes away and comes back: killed and started again on
its port, stopped and continued, or with its connections broken. Each costs
no worker its run. A ps that does not come back is in test_failures.py.
"""

import glob
import os
import re
import shutil
import signal
import subprocess
import time

import pytest

from conftest import final_accuracies
from test_failures import assert_clean_exit

pytestmark = pytest.mark.slow  # not in the fast tier


# Long enough to be stopped mid-run: 10 steps an epoch on the small data.
LONG_RUN = ['--epochs=100', '--print_every_epochs=1', '--validation_size=100',
            '--step_delay_ms=10']
FINAL_STEP = re.compile(r'^worker=\d+, local_steps=(\d+), global_step=(\d+),',
                        re.M)
RESTORED = r'^worker=0: restored the model from .*model\.ckpt-(\d+)$'


# Sync with 2 ps: the one killed holds a variable, the other the token
# queue, on which the chief's training step may wait while its update loop
# stops on the lost one. Async twice: a worker once hung after the second.
@pytest.mark.parametrize('script, num_ps, restarts', [
    ('async', 1, 2), ('sync', 1, 1), ('sync', 2, 1)])
def test_restarted_ps_resumes_from_the_last_checkpoint(procs, free_ports,
                                                      small_data, tmp_path,
                                                      script, num_ps,
                                                      restarts):
    logdir = tmp_path / 'logdir'
    flags = ['--data_dir=' + small_data, '--logdir=%s' % logdir,
             '--save_checkpoint_secs=1'] + LONG_RUN
    ports = free_ports(num_ps + 3)
    ps, workers = procs.cluster(script, lambda n: ports, *flags,
                                num_ps=num_ps)
    ps = ps if num_ps > 1 else [ps]
    lost = num_ps - 1
    for restart in range(1, restarts + 1):
        for i, worker in enumerate(workers):
            procs.wait_for_output(worker, r'^worker=%d,epoch=%d,'
                                  % (i, 10 * restart - 5), 60)
        assert glob.glob(str(logdir / 'model.ckpt-*.index'))
        os.kill(ps[lost].pid, signal.SIGKILL)
        ps[lost].wait()
        for i, worker in enumerate(workers):
            procs.wait_for_output(
                worker, r'^worker=%d: lost the connection to /job:ps/task:%d '
                        r'\(localhost:%d\); waiting up to 120 s for it$'
                        % (i, lost, ports[lost]), 30, count=restart)
        ps[lost] = procs.script(script, 'ps', lost, ports[:num_ps],
                                ports[num_ps:], *flags)
        restored = int(procs.wait_for_output(workers[0], RESTORED, 60,
                                             count=restart).group(1))
        assert restored > 0
        for i, worker in enumerate(workers):
            resumed = procs.wait_for_output(
                worker, r'^worker=%d: resuming at global_step=(\d+)$' % i, 60,
                count=restart)
            assert int(resumed.group(1)) >= restored
    procs.wait_all(workers + ps, 300)
    for i, worker in enumerate(workers):
        output = assert_clean_exit(procs, worker, 0)
        assert i in final_accuracies(output)
        [(_, final_step)] = FINAL_STEP.findall(output)
        assert int(final_step) > restored
    for proc in ps:
        assert_clean_exit(procs, proc, 0)


@pytest.mark.parametrize('script', ['async', 'sync'])
def test_frozen_ps_costs_no_worker(procs, free_ports, small_data, script):
    ps, workers = procs.cluster(script, free_ports, '--data_dir=' + small_data,
                                *LONG_RUN)
    for i, worker in enumerate(workers):
        procs.wait_for_output(worker, r'^worker=%d,epoch=5,' % i, 60)
    os.kill(ps.pid, signal.SIGSTOP)
    time.sleep(20)
    os.kill(ps.pid, signal.SIGCONT)
    procs.wait_all(workers + [ps], 300)
    for i, worker in enumerate(workers):
        assert i in final_accuracies(assert_clean_exit(procs, worker, 0))
    assert_clean_exit(procs, ps, 0)


@pytest.mark.parametrize('script', ['async', 'sync'])
def test_broken_connections_cost_no_worker(procs, free_ports, small_data,
                                           script):
    # The kernel closes the workers' connections to a ps that stays up, as
    # a busy network may: `ss -K` (root) destroys the sockets. Async steps
    # are short, and gRPC may connect again before one fails; sync workers
    # wait on the ps for tokens, and each recovers.
    if os.geteuid() != 0 or not shutil.which('ss'):
        pytest.skip('ss -K needs root and iproute2')
    ports = free_ports(4)
    ps, workers = procs.cluster(script, lambda n: ports,
                                '--data_dir=' + small_data, *LONG_RUN)
    for i, worker in enumerate(workers):
        procs.wait_for_output(worker, r'^worker=%d,epoch=5,' % i, 60)
    killed = subprocess.run(['ss', '-K', 'dport', '=', ':%d' % ports[0]],
                            check=True, capture_output=True, text=True,
                            timeout=10).stdout
    assert ':%d ' % ports[0] in killed  # one socket at least
    procs.wait_all(workers + [ps], 300)
    for i, worker in enumerate(workers):
        output = assert_clean_exit(procs, worker, 0)
        assert i in final_accuracies(output)
        # Whoever lost the connection found the live model, not a new one.
        assert 'again' not in output and 'restored' not in output
        if 'lost the connection' in output:
            assert 'resuming at' in output
            if i == 0:
                assert 'joined the live model' in output
    assert_clean_exit(procs, ps, 0)


def test_error_messages_parse_in_linear_time():
    from tensorflow.python.framework import error_interpolation
    import training_session
    original = error_interpolation.parse_message
    messages = ['', 'no tag', 'a {{node x/y}} b {{function_node f}} c',
                '{{node a}}{{function_node b}}{{node c-1.2}} {{bad tag',
                '{{node a b}} {{colocation_node n}}']
    expected = [original(m) for m in messages]
    try:
        training_session.parse_errors_in_linear_time()
        parse = error_interpolation.parse_message
        assert [parse(m) for m in messages] == expected
        started = time.time()
        parse('x' * 1000000 + ' {{node n}}')
        assert time.time() - started < 5  # the original: hours
    finally:
        error_interpolation.parse_message = original
