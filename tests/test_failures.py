"""Every task ends, on time: start order, lost tasks, bad input."""

import contextlib
import os
import re
import shutil
import signal
import socket
import sys
import time

import pytest

from conftest import (REPO, final_accuracies, left_running, listening,
                      own_lines)

pytestmark = pytest.mark.slow  # not in the fast tier

# Long enough to be killed mid-run: 10 steps an epoch on the small data. A
# ps waits 5 s for the workers killed here, not --worker_timeout's 120.
LONG_RUN = ['--epochs=300', '--print_every_epochs=1', '--validation_size=100',
            '--worker_timeout=5']
SHORT_RUN = ['--epochs=2', '--validation_size=100']
# Where a test waits for a fault to take its course, the two scripts' clusters
# run side by side: the waits overlap.
SCRIPTS = ('async', 'sync')


def ps_port(ps):
    return int(ps.args[4].rsplit(':', 1)[1])


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


# Sync workers say once which worker is gone; the chief put back the token
# it took, so training goes on. Async workers need no word: nobody waits.
GONE = r'^worker=(\d): /job:worker/task:(\d) \(localhost:\d+\) is gone; ' \
       r'training goes on without it$'


def test_a_worker_lost_and_the_others_go_on(procs, free_ports, small_data):
    """Side by side: worker 2 killed, async and sync (30 ms a step: the sync
    run outlasts the 5 s of silence after which a worker is gone, however
    fast the machine); worker 1 sent SIGINT (async) or SIGTERM (sync) to its
    process group, as Ctrl-C in its own terminal would."""
    killed = {script: procs.cluster(script, free_ports,
                                    '--data_dir=' + small_data, *LONG_RUN[1:],
                                    '--epochs=40', '--step_delay_ms=30',
                                    name=script + '-killed-')
              for script in SCRIPTS}
    signals = {'async': (signal.SIGINT, 130), 'sync': (signal.SIGTERM, 143)}
    stopped = {script: procs.cluster(script, free_ports,
                                     '--data_dir=' + small_data,
                                     *LONG_RUN[1:], '--epochs=40',
                                     name=script + '-signal-')
               for script in SCRIPTS}
    for ps, workers in killed.values():
        procs.wait_for_output(workers[2], r'^worker=2,epoch=1,', 60)
        os.kill(workers[2].pid, signal.SIGKILL)
    sent = {}
    for script, (ps, workers) in stopped.items():
        procs.wait_for_output(workers[1], r'^worker=1,epoch=1,', 60)
        os.killpg(workers[1].pid, signals[script][0])
        sent[script] = time.time()
    for script, (ps, workers) in stopped.items():
        procs.wait_all([workers[1]], 10, since=sent[script])
        assert_interrupted(procs, workers[1], signals[script][1],
                           '/job:worker/task:1')
    procs.wait_all([p for ps, workers in list(killed.values())
                    + list(stopped.values()) for p in workers + [ps]], 120)
    for script, (ps, workers) in killed.items():
        for i in (0, 1):
            output = assert_clean_exit(procs, workers[i], 0)
            assert i in final_accuracies(output)
            assert re.findall(GONE, output, re.M) == [(str(i), '2')] * (
                script == 'sync')
        assert workers[2].returncode == -signal.SIGKILL
        assert_clean_exit(procs, ps, 0)
    for ps, workers in stopped.values():
        for i in (0, 2):
            assert i in final_accuracies(assert_clean_exit(procs, workers[i],
                                                           0))
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


def test_a_task_missing_at_start_up(procs, free_ports, small_data, tmp_path):
    """Each case its own tasks, all at once: a ps that never comes, to a
    worker and to a chief; a chief that never comes, to a worker and the ps;
    a ps whose port answers the worker's probe and then nothing is there
    (opening a session would wait in TensorFlow for good), to the chief and
    to another worker."""
    flags = ['--data_dir=' + small_data] + SHORT_RUN
    started = time.time()
    ports = free_ports(4)
    no_ps = procs.script('async', 'worker', 1, ports[:1], ports[1:], *flags,
                         '--startup_timeout=3', name='no-ps-')
    # ~ as a shell would expand it, had it not been after '='. The data is
    # read, and the chief waits for the ps that is not there.
    home = tmp_path / 'home'
    shutil.copytree(small_data, str(home / 'data'))
    ports = free_ports(2)
    tilde = procs.start(
        [sys.executable, 'mnist_dist_async.py', '--job_name=worker',
         '--ps=localhost:%d' % ports[0], '--worker=localhost:%d' % ports[1],
         '--data_dir=~/data', '--logdir=~/logdir', '--startup_timeout=3',
         '--validation_size=100'], 'tilde-chief', env={'HOME': str(home)})
    ports = free_ports(4)
    no_chief = [procs.script('async', job, 0 if job == 'ps' else 1,
                             ports[:1], ports[1:], *flags,
                             '--startup_timeout=5', name='no-chief-')
                for job in ('ps', 'worker')]
    lost = [free_ports(4) for index in (0, 1)]
    with contextlib.ExitStack() as stack:
        answering = [stack.enter_context(socket.create_server(('', p[0])))
                     for p in lost]
        lost_ps = [procs.script('async', 'worker', index, p[:1], p[1:],
                                *flags, '--startup_timeout=5',
                                name='lost-ps-')
                   for index, p in enumerate(lost)]
        for port in answering:
            port.settimeout(60)
            port.accept()[0].close()
    procs.wait_all(lost_ps, 30)
    procs.wait_all([no_ps, tilde] + no_chief, 60, since=started)
    assert_one_error_line(procs, no_ps, 1, '/job:ps/task:0',
                          'did not come up within 3 s')
    assert_one_error_line(procs, tilde, 1, '/job:ps/task:0',
                          'did not come up within 3 s')
    assert (home / 'logdir').is_dir()
    assert not os.path.exists(os.path.join(REPO, '~'))
    assert_one_error_line(procs, no_chief[1], 1, 'the chief',
                          'did not initialize the model within 5 s')
    assert_one_error_line(procs, no_chief[0], 1, '/job:worker/task:0',
                          'did not come up within 5 s')
    for worker, ports in zip(lost_ps, lost):
        assert_one_error_line(procs, worker, 1, 'lost the connection to '
                              '/job:ps/task:0 (localhost:%d)' % ports[0])


def test_port_in_use(procs, free_ports, small_data):
    ports = free_ports(4)
    with socket.socket() as holder:
        holder.bind(('', ports[0]))
        holder.listen()
        ps = procs.script('async', 'ps', 0, ports[:1], ports[1:])
        procs.wait_all([ps], 60)
    assert_one_error_line(procs, ps, 1, 'port %d' % ports[0], 'in use')


CLUSTER = ['--ps=localhost:9001', '--worker=localhost:9002,localhost:9003']


USAGE_ERRORS = [
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
]


def test_usage_errors(procs):
    # A process for each, all at once.
    bad = [procs.start([sys.executable, 'mnist_dist_async.py'] + args,
                       'bad%d' % n)
           for n, (args, _) in enumerate(USAGE_ERRORS)]
    procs.wait_all(bad, 60)
    for proc, (args, words) in zip(bad, USAGE_ERRORS):
        assert_one_error_line(procs, proc, 2, *words)


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
    procs.wait_all(chiefs, 60)
    for chief, (_, _, words) in zip(chiefs, DATA_ERRORS):
        assert_one_error_line(procs, chief, 1, *words)


def assert_interrupted(procs, proc, status, task):
    output = assert_clean_exit(procs, proc, status)
    assert own_lines(procs.stderr(proc)) == [task + ': interrupted'], output


def test_unwritable_logdir(procs, free_ports, small_data, tmp_path):
    not_a_dir = tmp_path / 'file'
    not_a_dir.write_text('')
    ports = free_ports(2)
    chief = procs.script('async', 'worker', 0, ports[:1], ports[1:],
                         '--data_dir=' + small_data,
                         '--logdir=%s' % (not_a_dir / 'logdir'), *SHORT_RUN)
    procs.wait_all([chief], 60)
    assert_one_error_line(procs, chief, 2,
                          '--logdir=%s' % (not_a_dir / 'logdir'),
                          'cannot write there')
    # It never joined the cluster.
    assert not listening(ports[1])


def test_unreadable_checkpoint_ends_every_worker(procs, free_ports,
                                                 small_data, tmp_path):
    logdir = tmp_path / 'logdir'
    logdir.mkdir()
    (logdir / 'checkpoint').write_text(
        'model_checkpoint_path: "model.ckpt-10"\n')
    for suffix in ('index', 'data-00000-of-00001', 'meta'):
        (logdir / ('model.ckpt-10.' + suffix)).write_bytes(os.urandom(512))
    ps, workers = procs.cluster('async', free_ports,
                                '--data_dir=' + small_data,
                                '--logdir=' + str(logdir), *SHORT_RUN)
    procs.wait_all(workers + [ps], 60)
    assert_one_error_line(procs, workers[0], 1,
                          'cannot restore the checkpoint %s'
                          % (logdir / 'model.ckpt-10'),
                          'move it away, or choose another --logdir')
    for worker in workers[1:]:
        assert_one_error_line(procs, worker, 1, 'the chief',
                              'went away before the model was ready')
    assert_clean_exit(procs, ps, 0)


def test_sync_worker_started_again_rejoins(procs, free_ports, small_data):
    ports = free_ports(4)
    # Slow enough that the others still train when it is back.
    flags = ['--data_dir=' + small_data, '--step_delay_ms=20',
             '--epochs=60'] + LONG_RUN[1:]
    ps, workers = procs.cluster('sync', lambda n: ports, *flags)
    procs.wait_for_output(workers[2], r'^worker=2,epoch=1,', 60)
    os.kill(workers[2].pid, signal.SIGKILL)
    workers[2].wait()
    again = procs.script('sync', 'worker', 2, ports[:1], ports[1:], *flags)
    started = procs.wait_for_output(
        again, r'^worker=2, starting at global_step=(\d+)$', 60)
    assert int(started.group(1)) > 0
    procs.wait_all(workers[:2] + [again, ps], 120)
    for i, worker in enumerate(workers[:2] + [again]):
        assert i in final_accuracies(assert_clean_exit(procs, worker, 0))
    assert_clean_exit(procs, ps, 0)


# A stalled run ends every worker, each naming why, side by side: a frozen
# ps (async, sync), which accepts connections and answers nothing (only a
# call with a deadline tells it from a live one; the line names the ps,
# never the worker itself, which a failed call's error may name); and a sync
# chief killed, without which no update is applied.
def test_a_stalled_run_ends_every_worker_naming_why(procs, free_ports,
                                                    small_data):
    frozen = {script: procs.cluster(script, free_ports,
                                    '--data_dir=' + small_data,
                                    '--stall_timeout=10', *LONG_RUN,
                                    name=script + '-frozen-')
              for script in SCRIPTS}
    ps, workers = procs.cluster('sync', free_ports, '--data_dir=' + small_data,
                                '--stall_timeout=5', *LONG_RUN,
                                name='no-chief-')
    for _, run_workers in list(frozen.values()) + [(ps, workers)]:
        procs.wait_for_epoch(run_workers)
    for frozen_ps, _ in frozen.values():
        os.kill(frozen_ps.pid, signal.SIGSTOP)
    stopped = time.time()
    os.kill(workers[0].pid, signal.SIGKILL)
    procs.wait_all(workers + [ps], 60)
    for worker in workers[1:]:
        assert_one_error_line(
            procs, worker, 1, 'training stalled: no new global step for 5 s',
            'missing: /job:worker/task:0 (localhost:')
    assert_clean_exit(procs, ps, 0)
    procs.wait_all([w for _, ws in frozen.values() for w in ws], 10 + 30,
                   since=stopped)
    for frozen_ps, frozen_workers in frozen.values():
        for i, worker in enumerate(frozen_workers):
            assert_one_error_line(
                procs, worker, 1,
                'training stalled: no new global step for 10 s',
                '/job:ps/task:0 (localhost:%d) does not answer'
                % ps_port(frozen_ps))
            assert 'lost the connection to /job:worker/task:%d ' % i \
                not in procs.output(worker)
        os.kill(frozen_ps.pid, signal.SIGCONT)


def test_ctrl_c_on_the_ps_ends_every_worker_with_its_reason(
        procs, free_ports, small_data):
    # Both scripts side by side; the sync one would wait --ps_timeout (5 s)
    # for a ps that said nothing.
    runs = {script: procs.cluster(script, free_ports,
                                  '--data_dir=' + small_data,
                                  '--ps_timeout=5', *LONG_RUN, name=script)
            for script in SCRIPTS}
    for ps, workers in runs.values():
        procs.wait_for_epoch(workers)
    for ps, _ in runs.values():
        os.killpg(ps.pid, signal.SIGINT)
    sent = time.time()
    for ps, workers in runs.values():
        procs.wait_all([ps] + workers, 10, since=sent)
        assert_interrupted(procs, ps, 130, '/job:ps/task:0')
        for i, worker in enumerate(workers):
            assert_one_error_line(
                procs, worker, 1, 'lost the connection to /job:ps/task:0 '
                '(localhost:%d), which ended: "interrupted"' % ps_port(ps))


# The ps gives up on a worker that never came, and tells the others: a run
# with fewer workers than asked for is a mistake of the cluster's, which
# async and sync answer alike.
def test_worker_that_never_came_ends_every_task(procs, free_ports,
                                                small_data):
    ports = free_ports(4)
    # 20 ms a step: the two workers' run outlasts the ps's wait for the third.
    flags = ['--data_dir=' + small_data, '--startup_timeout=10',
             '--step_delay_ms=20'] + LONG_RUN
    tasks = [procs.script('sync', 'ps', 0, ports[:1], ports[1:], *flags)] + [
        procs.script('sync', 'worker', i, ports[:1], ports[1:], *flags)
        for i in (0, 1)]
    started = time.time()
    procs.wait_all(tasks, 10 + 10 + 15)  # its imports, on 2 cores, too
    missing = '/job:worker/task:2 (localhost:%d) did not come up within 10 s' \
        % ports[3]
    assert_one_error_line(procs, tasks[0], 1, missing)
    for worker in tasks[1:]:
        assert_one_error_line(procs, worker, 1, 'which ended: "%s"' % missing)
    assert time.time() - started < 10 + 10 + 15
