"""Which tasks live (ps_cluster/liveness.py): in-process, with servers of
one cluster in the test's own process, the counters' places, a worker's
LEFT and its reason told to every ps that answers, a recovery's beats, a
read alone, and the silent workers named (a worker's Watchdog:
worker/test_watchdog.py). In a cluster of processes:
many workers complete, their cost per worker flat (bench/bench_scale.py
measures it); a worker lost, and the others go on; a worker that fails at
start-up says why to the others.
"""

import concurrent.futures
import os
import re
import signal
import socket
import threading
import time

import pytest

from conftest import (LONG_RUN, SCRIPTS, START_UP, assert_clean_exit,
                      assert_interrupted, assert_one_error_line,
                      final_accuracies, listening, run_accuracy)

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
import tensorflow.compat.v1 as tf  # noqa: E402

from ps_cluster import liveness, server, sources  # noqa: E402
from ps_cluster.deadlines import call_within  # noqa: E402

from ps_counters import (beating, beats_and_reasons, done,  # noqa: E402
                         on_ps, start, start_ps)
from small_model import cluster_of  # noqa: E402

tf.disable_v2_behavior()








def test_the_counters_lie_on_each_ps_asked_for():
    with tf.Graph().as_default():
        beats, departures, farewells, reasons = liveness.counters(3, [0, 2])
    for k, vectors in zip((0, 2), zip(beats, departures, farewells, reasons)):
        assert [v.device for v in vectors] == ['/job:ps/task:%d' % k] * 4
        assert [v.op.name for v in vectors] == [
            'liveness/%s_%d' % (name, k)
            for name in ('beats', 'departures', 'farewell', 'reasons')]
        assert [v.shape.as_list() for v in vectors] == [[3], [3], [], [3]]


def test_say_left_marks_left_and_the_reason_on_every_ps(shared_cluster):
    cluster = shared_cluster(2, 2)
    for k in (0, 1):
        start_ps(cluster, k)
    assert liveness.say_left(cluster, 1, 'bad data') is None
    for k in (0, 1):
        beats, reasons = beats_and_reasons(cluster, k)
        assert beats.tolist() == [0, liveness.LEFT]
        assert reasons.tolist() == [b'', b'bad data']


def test_say_left_tries_again_for_a_ps_not_up_yet(free_ports):
    cluster = cluster_of(free_ports, 2, 2)
    start_ps(cluster, 0)
    telling = threading.Thread(target=liveness.say_left, daemon=True,
                               args=(cluster, 1, 'bad data', 30))
    telling.start()
    deadline = time.time() + 30
    while beats_and_reasons(cluster, 0)[0][1] != liveness.LEFT:
        assert time.time() < deadline
        time.sleep(0.1)
    # Ps 0 told, ps 1 not there: it goes on trying.
    assert telling.is_alive()
    start_ps(cluster, 1)
    telling.join(30)
    assert not telling.is_alive()
    beats, reasons = beats_and_reasons(cluster, 1)
    assert beats.tolist() == [0, liveness.LEFT]
    assert reasons.tolist() == [b'', b'bad data']


def test_say_left_gives_up_on_a_ps_that_never_comes_after_secs(free_ports):
    # Nothing ever listens at ps 1's port.
    cluster = cluster_of(free_ports, 2, 2)
    start_ps(cluster, 0)
    started = time.time()
    assert liveness.say_left(cluster, 1, 'bad data', secs=1) is None
    assert 1 <= time.time() - started < 1 + 2
    assert beats_and_reasons(cluster, 0)[0].tolist() == [0, liveness.LEFT]


def test_say_left_marks_no_left_without_its_reason(shared_cluster):
    cluster = shared_cluster(1, 2)
    start(cluster, 'ps', 0)
    # Only the beats set up: the reason cannot be written, and LEFT, which
    # the others act on, waits for it.
    on_ps(cluster, 0, lambda beats, *_: tf.variables_initializer([beats]))
    liveness.say_left(cluster, 1, 'bad data')
    assert on_ps(cluster, 0, lambda beats, *_: beats).tolist() == [0, 0]


def test_a_recovery_beats_on_the_ps_tasks_that_answer(shared_cluster,
                                                      free_ports):
    # Ps 1 is lost; ps 0, which stayed, hears worker 1 beat all along.
    cluster = tf.train.ClusterSpec({
        'ps': [shared_cluster(1, 2).task_address('ps', 0),
               'localhost:%d' % free_ports(1)[0]],
        'worker': ['localhost:%d' % port for port in free_ports(2)]})
    start_ps(cluster, 0)
    with liveness.beating(cluster, 1):
        time.sleep(1 + 2 * liveness.POLL_SECS)
    assert on_ps(cluster, 0, lambda beats, *_: beats)[1] >= 2


def test_a_recovery_s_beats_end_with_it_and_say_what_failed(shared_cluster,
                                                            monkeypatch):
    cluster = shared_cluster(1, 2)
    start_ps(cluster, 0)
    before = set(threading.enumerate())
    with liveness.beating(cluster, 1):
        pass
    assert set(threading.enumerate()) <= before

    failed = threading.Event()

    def beat_alone(*_):
        failed.set()
        raise ValueError('a mistake of ours')
    monkeypatch.setattr(liveness, 'beat_alone', beat_alone)
    with pytest.raises(ValueError, match='a mistake of ours'):
        with liveness.beating(cluster, 1):
            assert failed.wait(30)


def test_a_read_alone_passes_over_a_frozen_ps(free_ports):
    # As a beat alone does: no one-call session's deadlines waited out on it.
    port = free_ports(1)[0]
    with socket.create_server(('127.0.0.1', port)):
        cluster = tf.train.ClusterSpec({'ps': ['127.0.0.1:%d' % port],
                                        'worker': ['127.0.0.1:1']})
        with tf.Graph().as_default():
            with tf.device('/job:ps/task:0'):
                step = tf.train.get_or_create_global_step()
        started = time.monotonic()
        assert liveness.read_alone(cluster, step) is None
        assert time.monotonic() - started < server.CALL_SECS


def test_a_call_on_a_ps_that_accepts_and_never_answers_gives_up(free_ports):
    # What a ps stopped with SIGSTOP looks like to a connection: the kernel
    # accepts it, nobody answers. The session's creation and close have a
    # deadline too, not its run alone.
    port = free_ports(1)[0]
    with socket.create_server(('127.0.0.1', port)) as frozen:
        cluster = tf.train.ClusterSpec({'ps': ['127.0.0.1:%d' % port],
                                        'worker': ['127.0.0.1:1']})
        started = time.monotonic()
        # In a thread of its own: before the mend, the call never returned.
        assert call_within(30, liveness.run_on_ps, cluster, 0,
                           lambda beats, *_: beats) is None
        assert time.monotonic() - started < 3 * server.CALL_SECS


def test_silent_workers_names_the_others_whose_counters_stand(shared_cluster):
    # Worker 1 never beats, 2 is done, 3 beats; 0 is the Watchdog's own.
    cluster = shared_cluster(1, 4)
    start_ps(cluster, 0)
    done(cluster, 2)
    with beating(cluster, 3):
        assert liveness.silent_workers(sources.Place(cluster, 'worker', 0)) == [
            '/job:worker/task:1 (%s)' % cluster.task_address('worker', 1)]
        # An elastic run waits for no worker that never came.
        assert liveness.silent_workers(sources.Place(cluster, 'worker', 0),
                                       came_only=True) == []


# Each script, and each of 1 and 2 ps tasks: the other two pairs run with 3
# workers (test_mnist_dist.py, test_multihost.py, test_logdir.py).
@pytest.mark.slow
@pytest.mark.parametrize('script, num_ps', [('async', 1), ('sync', 2)])
def test_sixteen_workers_complete(procs, free_ports, small_data, script,
                                  num_ps):
    # Small steps, a few epochs: 17 or 18 processes take turns on 2 cores.
    ps, workers = procs.cluster(script, free_ports, '--data_dir=' + small_data,
                                '--epochs=3', '--validation_size=100',
                                '--learning_rate=0.5', num_workers=16,
                                num_ps=num_ps)
    ps = ps if num_ps > 1 else [ps]
    procs.wait_all(workers + ps, 420)
    outputs = [assert_clean_exit(procs, worker, 0) for worker in workers]
    for i, output in enumerate(outputs):
        assert i in final_accuracies(output), output
    # The classes are separable: with 2 ps tasks, w and b apart, too.
    assert run_accuracy(outputs, script) > 0.9
    for proc in ps:
        assert_clean_exit(procs, proc, 0)


GONE = r'^worker=(\d): /job:worker/task:(\d) \(localhost:\d+\) is gone; ' \
       r'training goes on without it$'



@pytest.mark.slow
def test_a_worker_lost_and_the_others_go_on(procs, free_ports, small_data):
    """In each script's cluster of 4 workers: worker 2 killed; worker 1 sent
    SIGINT (async) or SIGTERM (sync) to its process group, as Ctrl-C in its
    own terminal would; workers 0 and 3 go on. 30 ms a step: the sync run
    outlasts the 5 s of silence after which a worker is gone, however fast
    the machine, and a fast machine ended a run of 400 steps before the
    signal came."""
    runs = {script: procs.cluster(script, free_ports,
                                  '--data_dir=' + small_data, *LONG_RUN[1:],
                                  '--epochs=40', '--step_delay_ms=30',
                                  num_workers=4, name=script + '-lost-')
            for script in SCRIPTS}
    signals = {'async': (signal.SIGINT, 130), 'sync': (signal.SIGTERM, 143)}

    def lose_two(script):
        # Each cluster as it gets there: waiting for one first would leave
        # the other's run too short for a worker to fall silent in it.
        ps, workers = runs[script]
        procs.wait_for_output(workers[2], r'^worker=2,epoch=1,', START_UP)
        os.kill(workers[2].pid, signal.SIGKILL)
        procs.wait_for_output(workers[1], r'^worker=1,epoch=1,', START_UP)
        os.killpg(workers[1].pid, signals[script][0])
        return time.time()
    with concurrent.futures.ThreadPoolExecutor(len(runs)) as pool:
        sent = dict(zip(runs, pool.map(lose_two, runs)))
    for script, (ps, workers) in runs.items():
        procs.wait_all([workers[1]], 60, since=sent[script])
        assert_interrupted(procs, workers[1], signals[script][1],
                           '/job:worker/task:1')
    procs.wait_all([p for ps, workers in runs.values()
                    for p in workers + [ps]], 120)
    for script, (ps, workers) in runs.items():
        for i in (0, 3):
            output = assert_clean_exit(procs, workers[i], 0)
            assert i in final_accuracies(output)
            # Sync: the killed worker and the one SIGTERM (which a
            # scheduler sends to a task it may start again) left no word.
            assert sorted(re.findall(GONE, output, re.M)) == [
                (str(i), '1'), (str(i), '2')] * (script == 'sync')
        assert workers[2].returncode == -signal.SIGKILL
        assert_clean_exit(procs, ps, 0)


@pytest.mark.slow
def test_a_worker_that_fails_at_start_tells_the_others(procs, free_ports,
                                                       small_data, tmp_path):
    """Side by side: an async chief and evaluator whose --logdir is a
    regular file; every async worker, and the evaluator, on data that does
    not fit --validation_size; an async chief alone on such data, beside an
    evaluator that follows its --logdir; a sync worker 2, and an async one,
    on such data, beside an evaluator, every task with --export_dir; a
    lone chief with both mistakes, which it finds in the
    order flags, data, --logdir, server. A worker that fails tries for a
    few seconds to reach the ps: here each ps is up first, as the 19
    processes' imports on 2 cores may lie far apart."""
    a_file = tmp_path / 'a-file'
    a_file.write_text('')
    flags = ['--data_dir=' + small_data, '--epochs=3', '--validation_size=100']
    too_few = '--validation_size=2000'
    clusters = {
        'logdir-': ('async', ['--logdir=%s' % a_file], None),
        'data-': ('async', [too_few, '--logdir=%s' % (tmp_path / 'data')],
                  None),
        'chief-': ('async', ['--logdir=%s' % (tmp_path / 'chief')], 0),
        'sync-': ('sync', ['--logdir=%s' % (tmp_path / 'logdir'),
                           '--export_dir=%s' % (tmp_path / 'export')], 2),
        'async-': ('async', ['--logdir=%s' % (tmp_path / 'async'),
                             '--export_dir=%s' % (tmp_path / 'async-export')],
                   2)}
    ports = {name: free_ports(4) for name in clusters}
    ps = {name: procs.script(script, 'ps', 0, ports[name][:1],
                             ports[name][1:], *flags, *extra, name=name)
          for name, (script, extra, _) in clusters.items()}
    deadline = time.time() + START_UP
    while not all(listening(p[0]) for p in ports.values()):
        assert time.time() < deadline, 'a ps never came up'
        time.sleep(0.2)
    # The evaluator first: one that starts after the chief has left takes
    # the chief's word for an earlier run's.
    workers = {name: [procs.script(
        script, job, i, ports[name][:1], ports[name][1:], *flags, *extra,
        *([too_few] if (job, i) == ('worker', bad) else []), name=name)
        for job, i in [('evaluator', 0), ('worker', 0), ('worker', 1),
                       ('worker', 2)]]
        for name, (script, extra, bad) in clusters.items()}
    workers = {name: tasks[1:] + tasks[:1] for name, tasks in workers.items()}
    lone = free_ports(2)
    both = procs.script('async', 'worker', 0, lone[:1], lone[1:], *flags,
                        too_few, '--logdir=%s' % a_file, name='both-')

    chief, worker1, worker2, evaluator = workers['logdir-']
    procs.wait_all([chief, evaluator], START_UP)
    assert_one_error_line(procs, evaluator, 2,
                          '--logdir=%s: cannot write there' % a_file)
    reason = assert_one_error_line(
        procs, chief, 2, '--logdir=%s: cannot write there' % a_file).split(
        ': error: ', 1)[1]
    procs.wait_all([worker1, worker2, ps['logdir-']], START_UP)
    for worker in (worker1, worker2):
        assert_one_error_line(
            procs, worker, 1, 'the chief, /job:worker/task:0',
            'went away before the model was ready: "%s"' % reason)
    assert re.search(r'^/job:ps/task:0: every worker has ended; '
                     r'/job:worker/task:0 \(localhost:\d+\) left \(and 2 '
                     r'more: their own lines say why\): "%s"$'
                     % re.escape(reason),
                     assert_clean_exit(procs, ps['logdir-'], 0), re.M)

    procs.wait_all(workers['data-'], START_UP)
    for worker in workers['data-']:  # the evaluator among them
        assert_one_error_line(procs, worker, 1, '1100 training images')
    procs.wait_all([ps['data-']], START_UP)
    assert re.search(r'^/job:ps/task:0: every worker has ended; '
                     r'/job:worker/task:0 \(localhost:\d+\) left \(and 2 '
                     r'more: their own lines say why\): "\S+ has 1100 '
                     r'training images', assert_clean_exit(procs, ps['data-'],
                                                           0), re.M)

    chief, worker1, worker2, evaluator = workers['chief-']
    procs.wait_all([chief], START_UP)
    reason = assert_one_error_line(procs, chief, 1,
                                   '1100 training images').split(
        ': error: ', 1)[1]
    procs.wait_all([worker1, worker2, ps['chief-'], evaluator], START_UP)
    for worker in (worker1, worker2):
        assert_one_error_line(
            procs, worker, 1, 'the chief, /job:worker/task:0',
            'went away before the model was ready: "%s"' % reason)
    assert_one_error_line(procs, evaluator, 1, 'the chief, /job:worker/task:0'
                          ', left before global_step=90: "%s"' % reason)
    assert_clean_exit(procs, ps['chief-'], 0)

    chief, worker1, worker2, evaluator = workers['sync-']
    procs.wait_for_output(chief, r'^worker=0, final accuracy = ', START_UP)
    procs.wait_all(workers['sync-'] + [ps['sync-']], START_UP)
    reason = assert_one_error_line(procs, worker2, 1,
                                   '1100 training images').split(
        ': error: ', 1)[1]
    for worker in (chief, worker1, evaluator):
        assert_clean_exit(procs, worker, 0)
    assert re.search(r'^/job:ps/task:0: every worker has ended; '
                     r'/job:worker/task:2 \(localhost:\d+\) left: "%s"$'
                     % re.escape(reason),
                     assert_clean_exit(procs, ps['sync-'], 0), re.M)
    # One SavedModel, at the run's last step, whichever task wrote it.
    assert os.listdir(tmp_path / 'export') == ['30']
    outputs = procs.output(chief) + procs.output(evaluator)
    assert len(re.findall(r': exported the model at global_step=30 ',
                          outputs)) == 1
    assert len(re.findall(r': the model at global_step=30 is exported '
                          r'already, to ', outputs)) == 1

    # Async ends short of its last step, 90, without worker 2's 30: the
    # evaluator ends at the chief's last checkpoint, and exports it.
    chief, worker1, worker2, evaluator = workers['async-']
    procs.wait_all([chief, worker1], START_UP)
    procs.wait_all([evaluator], START_UP)
    assert_one_error_line(procs, worker2, 1, '1100 training images')
    for worker in (chief, worker1, evaluator):
        assert_clean_exit(procs, worker, 0)
    assert re.search(r'^evaluator: global_step=60, ', procs.output(evaluator),
                     re.M)
    assert os.listdir(tmp_path / 'async-export') == ['60']

    procs.wait_all([both], START_UP)
    assert_one_error_line(procs, both, 1, '1100 training images')
    assert not listening(lone[1])

    for proc in procs.running:
        assert 'did not come up' not in procs.output(proc)
        assert 'did not initialize' not in procs.output(proc)
