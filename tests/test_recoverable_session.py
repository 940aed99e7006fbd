"""The session that outlives a lost ps (ps_cluster/recoverable_session.py):
a ps killed and started again on its port, stopped and continued, or with
its connections broken, and every worker stopped and continued, each cost
no worker its run; a ps that does not come back ends every worker.
"""

import glob
import os
import shutil
import signal
import socket
import subprocess
import time

import pytest

from conftest import FINAL_STEP, assert_clean_exit, final_accuracies, ps_port

pytestmark = pytest.mark.slow  # not in the fast tier


# Long enough to be stopped mid-run: 10 steps an epoch on the small data.
LONG_RUN = ['--epochs=100', '--print_every_epochs=1', '--validation_size=100',
            '--step_delay_ms=10']


RESTORED = (r'^worker=0: restored the model from .*model\.ckpt-(\d+) at '
            r'global_step=\d+, on \d+ ps and \d+ workers$')


# Side by side: async, its ps restarted twice (a worker once hung after the
# second); sync, once; sync with 2 ps, once: the one killed holds a
# variable, the other the token queue, on which the chief's training step
# may wait while its update loop stops on the lost one.
def test_restarted_ps_resumes_from_the_last_checkpoint(procs, free_ports,
                                                      small_data, tmp_path):
    runs = []
    for script, num_ps, restarts in (('async', 1, 2), ('sync', 1, 1),
                                     ('sync', 2, 1)):
        name = '%s-%dps-' % (script, num_ps)
        logdir = tmp_path / (name + 'logdir')
        flags = ['--data_dir=' + small_data, '--logdir=%s' % logdir,
                 '--save_checkpoint_secs=1'] + LONG_RUN
        ports = free_ports(num_ps + 3)
        ps, workers = procs.cluster(script, lambda n: ports, *flags,
                                    num_ps=num_ps, name=name)
        runs.append(dict(script=script, num_ps=num_ps, restarts=restarts,
                         name=name, logdir=logdir, flags=flags, ports=ports,
                         ps=ps if num_ps > 1 else [ps], workers=workers,
                         lost=num_ps - 1))
    for restart in (1, 2):
        due = [run for run in runs if run['restarts'] >= restart]
        for run in due:
            procs.wait_for_epoch(run['workers'], 10 * restart - 5)
            assert glob.glob(str(run['logdir'] / 'model.ckpt-*.index'))
            os.kill(run['ps'][run['lost']].pid, signal.SIGKILL)
            run['killed'] = time.time()
        for run in due:
            lost, ports, num_ps = run['lost'], run['ports'], run['num_ps']
            run['ps'][lost].wait()
            for i, worker in enumerate(run['workers']):
                procs.wait_for_output(
                    worker, r'^worker=%d: lost the connection to '
                            r'/job:ps/task:%d \(localhost:%d\); waiting up to '
                            r'120 s for it$' % (i, lost, ports[lost]), 30,
                    count=restart, since=run['killed'])
            run['ps'][lost] = procs.script(
                run['script'], 'ps', lost, ports[:num_ps], ports[num_ps:],
                *run['flags'], name=run['name'])
            run['started'] = time.time()
        for run in due:
            run['restored'] = int(procs.wait_for_output(
                run['workers'][0], RESTORED, 60, count=restart,
                since=run['started']).group(1))
            assert run['restored'] > 0
            for i, worker in enumerate(run['workers']):
                resumed = procs.wait_for_output(
                    worker, r'^worker=%d: resuming at global_step=(\d+)$' % i,
                    60, count=restart, since=run['started'])
                assert int(resumed.group(1)) >= run['restored']
    procs.wait_all([p for run in runs for p in run['workers'] + run['ps']],
                   300)
    for run in runs:
        for i, worker in enumerate(run['workers']):
            output = assert_clean_exit(procs, worker, 0)
            assert i in final_accuracies(output)
            [(_, final_step)] = FINAL_STEP.findall(output)
            assert int(final_step) > run['restored']
        for proc in run['ps']:
            assert_clean_exit(procs, proc, 0)


# A pause that ends costs no run, side by side: the ps stopped (SIGSTOP)
# for 20 s, async and sync; and every worker of an async run, as behind a
# cut network, for longer than a notice of a worker gone and than the 15 s
# after which a ps once left: its ps waits (--worker_timeout).
def test_a_pause_costs_no_worker_its_run(procs, free_ports, small_data):
    runs = {script: procs.cluster(script, free_ports,
                                  '--data_dir=' + small_data, *LONG_RUN[1:],
                                  '--epochs=40', name=script + '-ps-paused-')
            for script in ('async', 'sync')}
    silent = procs.cluster('async', free_ports, '--data_dir=' + small_data,
                           *LONG_RUN[1:], '--epochs=60',
                           '--worker_timeout=60', name='workers-paused-')
    for ps, workers in runs.values():
        procs.wait_for_epoch(workers, 5)
    procs.wait_for_epoch(silent[1], 2)
    paused = [ps for ps, _ in runs.values()] + silent[1]
    for proc in paused:
        os.kill(proc.pid, signal.SIGSTOP)
    time.sleep(20)
    assert silent[0].poll() is None
    for proc in paused:
        os.kill(proc.pid, signal.SIGCONT)
    everything = list(runs.values()) + [silent]
    procs.wait_all([p for ps, workers in everything for p in workers + [ps]],
                   300)
    for ps, workers in everything:
        for i, worker in enumerate(workers):
            assert i in final_accuracies(assert_clean_exit(procs, worker, 0))
        assert_clean_exit(procs, ps, 0)


def test_broken_connections_cost_no_worker(procs, free_ports, small_data):
    # The kernel closes the workers' connections to a ps that stays up, as
    # a busy network may: `ss -K` (root) destroys the sockets. Async steps
    # are short, and gRPC may connect again before one fails; sync workers
    # wait on the ps for tokens, and each recovers. Side by side.
    if os.geteuid() != 0 or not shutil.which('ss'):
        pytest.skip('ss -K needs root and iproute2')
    runs = {}
    for script in ('async', 'sync'):
        ports = free_ports(4)
        runs[script] = ports, procs.cluster(script, lambda n: ports,
                                            '--data_dir=' + small_data,
                                            *LONG_RUN, name=script)
    for ports, (ps, workers) in runs.values():
        procs.wait_for_epoch(workers, 5)
    for ports, _ in runs.values():
        killed = subprocess.run(['ss', '-K', 'dport', '=', ':%d' % ports[0]],
                                check=True, capture_output=True, text=True,
                                timeout=10).stdout
        assert ':%d ' % ports[0] in killed  # one socket at least
    procs.wait_all([p for _, (ps, workers) in runs.values()
                    for p in workers + [ps]], 300)
    for ports, (ps, workers) in runs.values():
        for i, worker in enumerate(workers):
            output = assert_clean_exit(procs, worker, 0)
            assert i in final_accuracies(output)
            # Whoever lost the connection found the live model, not a new
            # one.
            assert 'again' not in output and 'restored' not in output
            if 'lost the connection' in output:
                assert 'resuming at' in output
                if i == 0:
                    assert 'joined the live model' in output
        assert_clean_exit(procs, ps, 0)


# A dying ps may still accept connections when a worker probes it; the
# worker then opens a new session, which waits in TensorFlow for the ps with
# no timeout. Another process answering at its port a moment makes every
# worker do so.
def test_lost_ps_ends_every_worker(procs, free_ports, small_data):
    runs = {(script, its_port): procs.cluster(
        script, free_ports, '--data_dir=' + small_data, '--ps_timeout=5',
        *LONG_RUN, name=script + its_port)
        for script, its_port in (('async', 'closed'), ('sync', 'closed'),
                                 ('sync', 'answering'))}
    for ps, workers in runs.values():
        procs.wait_for_epoch(workers)
    for ps, _ in runs.values():
        os.kill(ps.pid, signal.SIGKILL)
    killed = time.time()
    ps = runs['sync', 'answering'][0]
    ps.wait()
    with socket.create_server(('', ps_port(ps))):
        time.sleep(2)
    procs.wait_all([w for (_, its_port), (_, workers) in runs.items()
                    if its_port == 'closed' for w in workers], 30,
                   since=killed)
    procs.wait_all(runs['sync', 'answering'][1], 30)
    for ps, workers in runs.values():
        for i, worker in enumerate(workers):
            # TensorFlow logs the broken connection too; ours is the last
            # line.
            assert_clean_exit(procs, worker, 1)
            last = procs.stderr(worker).splitlines()[-1]
            assert last == ('/job:worker/task:%d: error: lost the connection '
                            'to /job:ps/task:0 (localhost:%d)'
                            % (i, ps_port(ps)))
