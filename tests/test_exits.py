"""How a task ends (ps_cluster/exits.py): in-process, the logic of what
can be tested without ending the process (the failure a task raises, a
usage error, the last words told the cluster); and the cluster test of what
only a cluster shows: Ctrl-C on a ps ends every worker quoting its reason
(on a worker, in test_liveness.py)."""

import concurrent.futures
import os
import re
import signal
import subprocess
import threading
import time

import pytest

from conftest import (LONG_RUN, SCRIPTS, START_UP, assert_clean_exit,
                      assert_interrupted, assert_one_error_line,
                      final_accuracies, own_lines, ps_port)
from ps_cluster import exits


def name():
    return '/job:ps/task:0'


def test_a_task_failed_carries_its_message_and_status():
    failed = exits.TaskFailed(ValueError('no data in /x'), 2)
    assert (str(failed), failed.message, failed.status) == (
        'no data in /x', 'no data in /x', 2)
    assert exits.TaskFailed('lost the ps').status == 1


def test_a_usage_error_is_one_line_and_status_2(monkeypatch, capsys):
    monkeypatch.setattr('sys.argv', ['/work/mnist_dist_async.py'])
    with pytest.raises(SystemExit) as end:
        exits.usage_error('--job_name is required')
    assert end.value.code == 2
    assert capsys.readouterr() == (
        '', 'mnist_dist_async.py: error: --job_name is required\n')


def test_the_last_words_are_told_the_last_way_given():
    first, last = [], []
    end = exits.TaskEnd(name)
    end.before_leaving(first.append)
    end.before_leaving(last.append)
    end._say_last_words('interrupted')
    assert (first, last) == ([], ['interrupted'])


def test_no_way_to_tell_says_nothing(capsys):
    exits.TaskEnd(name)._say_last_words('interrupted')
    end = exits.TaskEnd(name)
    end.before_leaving(None)  # a TF2 task but the coordinator
    end._say_last_words('interrupted')
    assert capsys.readouterr() == ('', '')


def test_a_tell_that_blocks_is_given_up_on(monkeypatch):
    monkeypatch.setattr(exits.TaskEnd, 'LAST_WORDS_SECS', 0.1)
    frozen = threading.Event()  # a frozen ps, thawed when the test is done
    end = exits.TaskEnd(name)
    end.before_leaving(lambda reason: frozen.wait())
    started = time.monotonic()
    end._say_last_words('interrupted')
    assert time.monotonic() - started < 2
    frozen.set()


def test_a_tell_that_fails_is_said_in_one_line(capsys):
    def tell(reason):
        raise ConnectionError('the ps is gone')
    end = exits.TaskEnd(name)
    end.before_leaving(tell)
    end._say_last_words('interrupted')
    # One line naming the task, never a traceback.
    assert capsys.readouterr() == (
        '', '/job:ps/task:0: cannot tell the other tasks why: the ps is '
            'gone\n')


@pytest.mark.slow  # not in the fast tier
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
        procs.wait_all([ps] + workers, START_UP, since=sent)
        assert_interrupted(procs, ps, 130, '/job:ps/task:0')
        for i, worker in enumerate(workers):
            assert_one_error_line(
                procs, worker, 1, 'lost the connection to /job:ps/task:0 '
                '(localhost:%d), which ended: "interrupted"' % ps_port(ps))


RESTORED = (r'^worker=0: restored the model from .*model\.ckpt-(\d+) at '
            r'global_step=\d+, on \d+ ps and \d+ workers$')


def global_step(port):
    """The global step on the ps at localhost:port, read as the scripts
    make it: a resource variable on ps 0."""
    import tensorflow.compat.v1 as tf
    with tf.Graph().as_default():
        with tf.device('/job:ps/task:0'):
            step = tf.Variable(0, dtype=tf.int64, name='global_step',
                               use_resource=True, trainable=False)
        with tf.Session('grpc://localhost:%d' % port,
                        config=tf.ConfigProto(device_filters=[
                            '/job:ps/task:0'])) as sess:
            return sess.run(step)


SAVED = r'saved the model at global_step=(\d+)'


def preempt(procs, script, flags, ports, name):
    """A preemption of the ps alone, then of every task at once, each
    mid-way between the chief's checkpoints (an hour apart: only the first
    is made), each followed by the tasks started again: the run resumes at
    the step the chief saved, no lower than the step read just before the
    SIGTERM, and ends well."""
    def task(job, index, epochs=10000):
        return procs.script(script, job, index, ports[:1], ports[1:], *flags,
                            '--epochs=%d' % epochs, name=name)
    ps, workers = task('ps', 0), [task('worker', i) for i in range(3)]
    chief = workers[0]
    procs.wait_for_epoch(workers, 3)
    before = global_step(ports[0])
    os.kill(ps.pid, signal.SIGTERM)
    # The workers hold, the chief saves, then the ps goes.
    procs.wait_all([ps], START_UP)
    saved = int(re.fullmatch(
        r'/job:ps/task:0: preempted; the chief ' + SAVED,
        assert_one_line(procs, ps, 143)).group(1))
    assert saved >= before
    for i, worker in enumerate(workers):
        procs.wait_for_output(
            worker, r'^worker=%d: /job:ps/task:0 \(localhost:%d\) was '
                    r'preempted; waiting up to 120 s for it$' % (i, ports[0]),
            START_UP)
    procs.wait_for_output(chief, '^worker=0: ' + SAVED + '$', START_UP)
    ps = task('ps', 0)
    restored = int(procs.wait_for_output(chief, RESTORED, START_UP).group(1))
    assert restored == saved
    for i, worker in enumerate(workers):
        procs.wait_for_output(worker, r'^worker=%d: resuming at '
                              r'global_step=\d+$' % i, START_UP)

    # Every task at once, as a suspended JobSet's.
    epochs = len(re.findall('^worker=0,epoch=', procs.output(chief), re.M))
    procs.wait_for_output(chief, '^worker=0,epoch=', START_UP,
                          count=epochs + 3)
    before = global_step(ports[0])
    sent = time.time()
    for proc in [ps] + workers:
        os.kill(proc.pid, signal.SIGTERM)
    procs.wait_all([ps] + workers, START_UP)
    assert time.time() - sent < 20  # --preemption_grace
    saved = int(re.search('^worker=0: preempted: ' + SAVED + '$',
                          assert_clean_exit(procs, chief, 143),
                          re.M).group(1))
    assert own_lines(procs.stderr(chief)) == [] and saved >= before
    for i in (1, 2):
        assert_interrupted(procs, workers[i], 143, '/job:worker/task:%d' % i)
    assert assert_one_line(procs, ps, 143) == (
        '/job:ps/task:0: preempted; the chief saved the model at '
        'global_step=%d' % saved)
    # Started again, to an epoch or two past it: 10 steps an epoch, of
    # each worker in async.
    epochs = saved // (30 if script == 'async' else 10) + 2
    ps, workers = task('ps', 0, epochs), [task('worker', i, epochs)
                                          for i in range(3)]
    procs.wait_all(workers + [ps], START_UP)
    restored = re.search(RESTORED, procs.output(workers[0]), re.M)
    assert int(restored.group(1)) == saved
    for i, worker in enumerate(workers):
        assert i in final_accuracies(assert_clean_exit(procs, worker, 0))
    assert_clean_exit(procs, ps, 0)


def assert_one_line(procs, proc, status):
    """The one line of our own that proc ended with, status and all."""
    output = assert_clean_exit(procs, proc, status)
    lines = own_lines(procs.stderr(proc))
    assert len(lines) == 1, output
    return lines[0]


def preemption_flags(data, logdir):
    return ['--data_dir=' + data, '--logdir=%s' % logdir,
            '--save_checkpoint_secs=3600', '--print_every_epochs=1',
            '--validation_size=100', '--step_delay_ms=20']


# SIGTERM, a scheduler's notice, side by side in each script's cluster: the
# ps alone, then every task at once (preempt()).
@pytest.mark.slow  # not in the fast tier
def test_a_preemption_loses_no_step(procs, free_ports, small_data, tmp_path):
    with concurrent.futures.ThreadPoolExecutor(len(SCRIPTS)) as pool:
        runs = [pool.submit(preempt, procs, script,
                            preemption_flags(small_data, tmp_path / script),
                            free_ports(4), script + '-')
                for script in SCRIPTS]
        for run in runs:
            run.result()


# Every task of a run whose chief cannot save, its --logdir made read-only
# (immutable) once it trains: all end within the grace, and the ps says
# what was not saved.
@pytest.mark.slow  # not in the fast tier
def test_a_chief_that_cannot_save_as_it_is_preempted(procs, free_ports,
                                                     small_data, tmp_path):
    readonly = tmp_path / 'readonly'
    readonly.mkdir()
    # Immutable: not even root may add a file to it.
    if os.geteuid() or subprocess.run(['chattr', '+i', str(readonly)],
                                      capture_output=True).returncode:
        pytest.skip('cannot make a folder immutable here (root only, not on '
                    'tmpfs or overlayfs)')
    subprocess.run(['chattr', '-i', str(readonly)], check=True)
    try:
        ps, workers = procs.cluster('async', free_ports,
                                    *preemption_flags(small_data, readonly),
                                    '--epochs=10000', name='readonly-')
        procs.wait_for_epoch(workers, 3)
        subprocess.run(['chattr', '+i', str(readonly)], check=True)
        sent = time.time()
        for proc in [ps] + workers:
            os.kill(proc.pid, signal.SIGTERM)
        procs.wait_all([ps] + workers, START_UP)
        assert time.time() - sent < 20  # --preemption_grace
    finally:
        subprocess.run(['chattr', '-i', str(readonly)])
    cannot = ('cannot save the model in --logdir=%s (' % readonly)
    assert cannot in assert_clean_exit(procs, workers[0], 143)
    line = assert_one_line(procs, ps, 143)
    assert line.startswith('/job:ps/task:0: preempted; the chief ' + cannot)
    assert line.endswith('its updates since the last checkpoint are lost')
