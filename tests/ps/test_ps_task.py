"""A ps's end of a run (ps_cluster/ps/ps_task.py): in-process, on a ps server
of the test's own process, the counters it sets up, whom it waits for, what
it returns, a worker that never came, and the farewell it leaves the
workers; in a cluster of processes, a worker that never came ends every
task. A ps waits for silent workers in test_recoverable_session.py."""

import os
import re
import signal
import threading
import time

import pytest

from conftest import (FINAL_STEP, LONG_RUN, START_UP, assert_clean_exit,
                      assert_one_error_line, own_lines, run_accuracy)

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
import tensorflow.compat.v1 as tf  # noqa: E402

from ps_cluster import liveness, sources  # noqa: E402
from ps_cluster.deadlines import Limit  # noqa: E402
from ps_cluster.exits import TaskFailed  # noqa: E402
from ps_cluster.ps import ps_task  # noqa: E402
from ps_counters import beat, beating, done, on_ps  # noqa: E402
from small_model import server  # noqa: E402

tf.disable_v2_behavior()

TOLD = 'the ps was told to stop'


def limits(startup_timeout, worker_timeout):
    """serve_until_workers_gone()'s limits, in seconds."""
    return (Limit(startup_timeout, '--startup_timeout'),
            Limit(worker_timeout, '--worker_timeout'))


@pytest.fixture
def cluster(shared_cluster):
    """A ps and two workers: the ps is a server of this process; the tests
    act for the workers, which need no server, in sessions on the ps."""
    return shared_cluster(1, 2)


@pytest.fixture
def ps(cluster):
    return ps_task.PsTask(server(cluster, 'ps', 0),
                          sources.Place(cluster, 'ps', 0))


def read(cluster):
    """Ps 0's counters: beats, departures, farewell, reasons."""
    return on_ps(cluster, 0, lambda *counters: counters)


def test_the_ps_sets_up_its_counters_on_its_own_server(cluster, ps):
    beats, departures, farewell, reasons = read(cluster)
    assert beats.tolist() == [0, 0] and departures.tolist() == [0, 0]
    assert farewell == b'' and reasons.tolist() == [b'', b'']


def test_the_ps_returns_the_workers_that_left_and_why_once_all_ended(
        cluster, ps):
    done(cluster, 0)
    liveness.say_left(cluster, 1, 'bad data')
    assert ps.serve_until_workers_gone(*limits(5, 5)) == [(1, 'bad data')]
    # Ps 0 counted the departure, for the other workers to read.
    beats, departures, farewell, reasons = read(cluster)
    assert departures.tolist() == [0, 1]


def test_a_beat_after_left_leaves_the_worker_left(cluster, ps):
    # A failing worker's Watchdog may beat once more after the worker told
    # the ps it left, before the process ends.
    done(cluster, 0)
    liveness.say_left(cluster, 1, 'bad data')
    beat(cluster, 1)
    assert ps.serve_until_workers_gone(*limits(5, 5)) == [(1, 'bad data')]


def test_a_beating_worker_keeps_the_ps_serving_until_it_is_done(cluster,
                                                                ps):
    done(cluster, 0)
    ended = threading.Event()

    def worker():
        # Beats for longer than worker_timeout, then ends.
        with beating(cluster, 1):
            time.sleep(1.5)
        done(cluster, 1)
        ended.set()

    thread = threading.Thread(target=worker, daemon=True)
    thread.start()
    assert ps.serve_until_workers_gone(*limits(5, 1)) == []
    assert ended.is_set()
    thread.join()


def test_a_silent_worker_is_counted_gone_then_no_longer_waited_for(
        cluster, ps, monkeypatch, capsys):
    monkeypatch.setattr(liveness, 'GONE_SECS', 0.3)
    done(cluster, 0)
    beat(cluster, 1)
    # Silent, not LEFT: no reason to return, but the ps says whom it left.
    assert ps.serve_until_workers_gone(*limits(5, 1)) == []
    beats, departures, farewell, reasons = read(cluster)
    assert departures.tolist() == [0, 1]
    assert capsys.readouterr().out == (
        '/job:ps/task:0: every worker has ended or fell silent: '
        '/job:worker/task:1 (%s) not heard for 1 s (--worker_timeout)\n'
        % cluster.task_address('worker', 1))


def test_a_worker_that_never_beat_fails_the_ps_after_its_startup_timeout(
        cluster, ps, monkeypatch):
    monkeypatch.setattr(ps_task, 'STARTUP_GRACE_SECS', 0.5)
    done(cluster, 0)
    started = time.time()
    with pytest.raises(TaskFailed) as failed:
        ps.serve_until_workers_gone(*limits(0.5, 60))
    # The grace is the ps's own: the line names the workers' timeout.
    assert time.time() - started >= 0.5 + 0.5
    assert failed.value.message == (
        '/job:worker/task:1 (%s) did not come up within 0.5 s '
        '(--startup_timeout)' % cluster.task_address('worker', 1))


def test_an_elastic_ps_waits_for_the_chief_and_the_workers_that_came(
        cluster, ps, capsys):
    # --min_workers=1 of 2: worker 1 never comes, and is not waited for
    # once the chief has ended.
    done(cluster, 0)
    assert ps.serve_until_workers_gone(*limits(5, 60), min_workers=1) == []
    assert capsys.readouterr().out == (
        '/job:ps/task:0: every worker that came has ended: 1 of the 2 '
        'listed came, 0 left\n')


def test_an_elastic_ps_leaves_a_chief_that_fell_silent(cluster, ps,
                                                      capsys):
    # The chief died without a word (SIGKILL, a lost node), worker 1 never
    # came: the ps ends after --worker_timeout, as without --min_workers.
    beat(cluster, 0)
    assert ps.serve_until_workers_gone(*limits(5, 1), min_workers=1) == []
    assert capsys.readouterr().out == (
        '/job:ps/task:0: every worker has ended or fell silent: '
        '/job:worker/task:0 (%s) not heard for 1 s (--worker_timeout)\n'
        '/job:ps/task:0: every worker that came has ended: 1 of the 2 '
        'listed came, 0 left\n' % cluster.task_address('worker', 0))


def test_an_elastic_ps_ends_the_run_with_too_few_workers(cluster, ps,
                                                         monkeypatch):
    monkeypatch.setattr(ps_task, 'STARTUP_GRACE_SECS', 0.5)
    started = time.time()
    with pytest.raises(TaskFailed) as failed:
        ps.serve_until_workers_gone(*limits(0.5, 60), min_workers=1)
    assert time.time() - started >= 0.5 + 0.5
    assert failed.value.message == (
        'fewer than 1 workers (--min_workers) for 0.5 s (--startup_timeout): '
        '0 of the 2 listed here')


def test_the_farewell_waits_for_a_beating_worker_no_longer_than_secs(
        cluster, ps):
    with beating(cluster, 1):
        started = time.time()
        ps.tell_workers(TOLD, 2)
        # Worker 1 never ends: the ps waits until 1 s before its time is up.
        assert 1 <= time.time() - started < 2
    beats, departures, farewell, reasons = read(cluster)
    assert farewell == TOLD.encode()


# The ps gives up on a worker that never came, and tells the others: a run
# with fewer workers than asked for is a mistake of the cluster's, which
# async and sync answer alike.
@pytest.mark.slow
def test_worker_that_never_came_ends_every_task(procs, free_ports,
                                                small_data):
    ports = free_ports(4)
    flags = ['--data_dir=' + small_data, '--startup_timeout=10'] + LONG_RUN
    tasks = [procs.script('sync', 'ps', 0, ports[:1], ports[1:], *flags)] + [
        procs.script('sync', 'worker', i, ports[:1], ports[1:], *flags)
        for i in (0, 1)]
    procs.wait_all(tasks, START_UP)
    missing = ('/job:worker/task:2 (localhost:%d) did not come up within 10 '
               's (--startup_timeout)' % ports[3])
    assert_one_error_line(procs, tasks[0], 1, missing)
    for worker in tasks[1:]:
        assert_one_error_line(procs, worker, 1, 'which ended: "%s"' % missing)


# Elastic async, side by side, 4 workers listed: --min_workers=2, workers 0
# and 1 at first, 2 and 3 once the chief has printed its 2nd epoch, and
# worker 3 SIGTERMed mid-run, as a JobSet scaled 2 -> 4 -> 3 would; the
# same with worker 3 never started, until the chief's final line: it then
# ends at once, and so it does again once the ps has gone (the chief's
# marker in --logdir says where the run ended), but after --startup_timeout
# without a --logdir; and every worker from the start, not elastic. Every
# task ends with its status, the ps by itself; an elastic run ends at the
# global step of the listed workers' whole run, whoever came, and its model
# is the full run's, within 0.02.
@pytest.mark.slow
def test_workers_that_come_late_leave_or_never_come(procs, free_ports,
                                                    small_data, tmp_path):
    def flags(name, *more):
        return ['--data_dir=' + small_data, '--validation_size=100',
                '--epochs=30', '--print_every_epochs=1', '--step_delay_ms=20',
                '--learning_rate=0.5', '--logdir=%s' % (tmp_path / name),
                *more]

    def start(name, ports, indices, *more, tag=''):
        return [procs.script('async', 'worker', i, ports[:1], ports[1:],
                             *flags(name, *more), name=name + tag)
                for i in indices]
    runs = {}
    for name, more in (('elastic', ['--min_workers=2']),
                       ('never', ['--min_workers=2']), ('full', [])):
        ports = free_ports(5)
        ps = procs.script('async', 'ps', 0, ports[:1], ports[1:],
                          *flags(name, *more), name=name)
        first = 4 if name == 'full' else 2
        runs[name] = ports, more, ps, start(name, ports, range(first), *more)
    chief = runs['elastic'][3][0]
    procs.wait_for_output(chief, r'^worker=0,epoch=1,', START_UP)
    ports, more, _, workers = runs['elastic']
    workers += start('elastic', ports, range(2, 4), *more)
    worker3 = workers[3]
    procs.wait_for_output(worker3, r'^worker=3,epoch=1,', START_UP)
    os.kill(worker3.pid, signal.SIGTERM)
    ports, more, never_ps, never = runs['never']
    procs.wait_for_output(never[0], r'^worker=0,epoch=1,', START_UP)
    never += start('never', ports, [2], *more)
    # Worker 3 comes once the chief has ended its training.
    procs.wait_for_output(never[0], r'^worker=0, final accuracy', START_UP)
    late = start('never', ports, [3], *more, tag='late')
    accuracies = {}
    for name, (ports, _, ps, workers) in runs.items():
        procs.wait_all(workers + [ps], START_UP)
        ended = [w for w in workers if w is not worker3]
        outputs = [assert_clean_exit(procs, w, 0) for w in ended]
        accuracies[name] = run_accuracy(outputs, 'async')
        said = assert_clean_exit(procs, ps, 0)
        # Worker 3 of 'never' came once the chief had ended: before the ps
        # left, or after.
        came = {'elastic': '4 of the 4 listed came, 1 left',
                'never': '[34] of the 4 listed came, 0 left'}.get(name)
        assert not came or re.search('^/job:ps/task:0: every worker that '
                                     'came has ended: ' + came, said,
                                     re.M), said
        # The run's last step, 30 epochs of 10 steps by each of the 4
        # listed workers, is the chief's: in its last checkpoint.
        last = max(int(step) for output in outputs
                   for _, step in FINAL_STEP.findall(output))
        assert last >= 30 * 10 * 4
        assert (tmp_path / name / ('model.ckpt-%d.index' % last)).exists()
    # The late workers of an elastic run shared its steps.
    elastic = [procs.output(w) for w in runs['elastic'][3]]
    assert all(re.search(r'^worker=%d,epoch=0,' % i, output, re.M)
               for i, output in enumerate(elastic))
    assert_clean_exit(procs, worker3, 143)
    assert own_lines(procs.stderr(worker3)) == [
        '/job:worker/task:3: left on SIGTERM; the others train on']
    assert ('/job:worker/task:3 (localhost:%d) left: "left on SIGTERM (a '
            'scale-down)"' % runs['elastic'][0][4]) in procs.output(
                runs['elastic'][2])
    for name in ('elastic', 'never'):
        assert abs(accuracies[name] - accuracies['full']) <= 0.02, accuracies
    # Worker 3 came after the end, and again after the ps had gone: each
    # time it ends at once, saying where the run ended; without --logdir,
    # it says so after --startup_timeout.
    ports, more, _, _ = runs['never']
    for tag, without in (('again', []),
                         ('unknown', ['--logdir=', '--startup_timeout=2'])):
        procs.wait_all(late, START_UP)  # on the same port
        late += start('never', ports, [3], *more, *without, tag=tag)
    procs.wait_all(late, START_UP)
    for worker in late[:2]:
        output = assert_clean_exit(procs, worker, 0)
        ended = re.search(r'^worker=3: the run ended at global_step=(\d+), '
                          r'before this worker came: nothing is left to '
                          r'train$', output, re.M)
        assert ended and int(ended.group(1)) >= 30 * 10 * 4, output
        assert 'epoch=' not in output
    assert_one_error_line(procs, late[2], 1, 'did not come up within 2 s '
                          '(--startup_timeout); the run may have ended before '
                          'this worker came')
