"""How stale a worker's gradients are (ps_cluster/worker/staleness.py): the
counts and the copies of the steps in-process; what they show on real clusters,
a straggler among them."""

import os
import signal
import time

import numpy as np
import pytest

from conftest import START_UP, run_accuracy, staleness_of
from ps_cluster.worker.staleness import (Staleness, global_step_copy,
                                  global_steps_around)

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
import tensorflow.compat.v1 as tf  # noqa: E402

tf.disable_v2_behavior()

def test_async_applies_every_gradient_however_stale():
    staleness = Staleness(drops_stale=False)
    for s in (0, 2, 1, 2):
        staleness.add(s)
    assert staleness.line(1) == ('worker=1, gradients=4, applied=4, '
                                 'dropped=0, staleness mean=1.25 '
                                 '(0:1 1:1 2:2)')


def test_sync_drops_every_stale_gradient_of_a_run():
    staleness = Staleness(drops_stale=True)
    staleness.add(0, gradients=1)
    staleness.add(3, gradients=1)
    staleness.add(0, gradients=1)
    assert staleness_of(staleness.line(0)) == (3, 2, 1, 1.0, {0: 2, 3: 1})


def test_no_runs_no_staleness():
    assert Staleness(drops_stale=False).line(0) == (
        'worker=0, gradients=0, applied=0, dropped=0, staleness mean=0.00 ()')
    assert Staleness(drops_stale=False).histogram().num == 0


def test_the_copy_keeps_the_step_it_read_and_the_after_the_update():
    # A plain read of a ref variable is an alias: fetched with the update,
    # it shows the step after it. The copies show the step before and
    # after. The update waits for the first copy, as a worker's waits for
    # its gradients: independent of it, it might run first.
    with tf.Graph().as_default():
        global_step = tf.train.get_or_create_global_step()
        before = global_step_copy(global_step)
        with tf.control_dependencies([before]):
            update = tf.assign_add(global_step, 1)
        after = global_step_copy(global_step, update)
        alias = global_step.read_value()
        with tf.Session() as sess:
            sess.run(tf.global_variables_initializer())
            for step in range(3):
                assert sess.run([before, after, alias]) == [
                    step, step + 1, step + 1]


def test_the_steps_around_an_update_in_one_tensor():
    with tf.Graph().as_default():
        global_step = tf.train.get_or_create_global_step()
        # A worker's update comes long after the run starts, once its
        # gradients are computed: here, after 0.2 s.
        computed = tf.numpy_function(lambda: time.sleep(0.2) or np.int64(0),
                                     [], tf.int64)
        with tf.control_dependencies([computed]):
            update = tf.assign_add(global_step, 1)
        steps = global_steps_around(global_step, update)
        with tf.Session() as sess:
            sess.run(tf.global_variables_initializer())
            assert [sess.run(steps).tolist() for _ in range(2)] == [
                [0, 1], [1, 2]]


@pytest.mark.slow
def test_what_staleness_shows_on_real_clusters(procs, free_ports,
                                               small_data):
    # Side by side: async with one worker; async with three, the last
    # slowed by 20 ms a step more than the others, for 600 steps, so that
    # the workers train together despite their staggered starts (a
    # worker's first run, slow, may be many updates stale); sync with 2
    # gradients an update of 3, the last worker slowed by 100 ms (at 20 ms
    # and at 50, a suite's busy cores left it only 43% of its gradients
    # dropped), which the other two outpace. 10 steps an epoch.
    common = ['--data_dir=' + small_data, '--validation_size=100',
              '--learning_rate=0.5', '--print_every_epochs=100']
    alone = procs.cluster('async', free_ports, *common, '--epochs=20',
                          num_workers=1, name='alone')
    clusters = {'alone': alone}
    for script, flags, delays in (
            ('async', ['--epochs=60'], (5, 5, 25)),
            ('sync', ['--epochs=20', '--replicas_to_aggregate=2'],
             (0, 0, 100))):
        ports = free_ports(4)
        ps = procs.script(script, 'ps', 0, ports[:1], ports[1:], *common,
                          *flags, name=script)
        workers = [procs.script(script, 'worker', i, ports[:1], ports[1:],
                                *common, *flags, '--step_delay_ms=%d' % ms,
                                name=script)
                   for i, ms in enumerate(delays)]
        clusters[script] = (ps, workers)
    # The sync chief alone makes an update of its own two gradients: held
    # from its model's start until the others have opened their sessions,
    # lest it make most of the run's updates before they start.
    chief, *others = clusters['sync'][1]
    procs.wait_for_output(chief, r'^worker=0: initialized the model$',
                          START_UP)
    os.kill(chief.pid, signal.SIGSTOP)
    for worker in others:
        procs.wait_for_output(worker, r'^worker=\d, starting at global_step=',
                              START_UP)
    os.kill(chief.pid, signal.SIGCONT)
    for ps, workers in clusters.values():
        procs.wait_all(workers + [ps], 180)
        for proc in workers + [ps]:
            assert proc.returncode == 0, procs.output(proc)
    seen = {name: [staleness_of(procs.stdout(w)) for w in workers]
            for name, (_, workers) in clusters.items()}

    # One worker alone: nobody else updates between its read and update.
    (gradients, applied, dropped, mean, counts), = seen['alone']
    assert (gradients, applied, dropped, counts) == (200, 200, 0, {0: 200})

    # Async: every gradient applied, each counted once; two fast workers
    # update while the slow one computes, mostly one while a fast one does.
    for gradients, applied, dropped, mean, counts in seen['async']:
        assert gradients == applied == sum(counts.values()) == 600
        assert dropped == 0 and mean > 0
    slow = seen['async'][2][3]
    assert all(slow > fast[3] for fast in seen['async'][:2]), seen['async']
    assert all(fast[3] < 3 for fast in seen['async'][:2]), seen['async']

    # Sync: a gradient of staleness 0 is applied, any other dropped. With
    # one gradient an update to spare, the slow worker's are dropped most
    # often; the fast ones lose some too, to the spare tokens that pile up
    # in the queue, old by the time they take them.
    sync = seen['sync']
    for gradients, applied, dropped, mean, counts in sync:
        assert applied == counts.get(0, 0)
        assert applied + dropped == gradients == sum(counts.values())
    rates = [dropped / gradients for gradients, _, dropped, _, _ in sync]
    assert rates[2] > 0.5 and rates[2] > max(rates[:2]), sync
    # 20 epochs of updates, 2 gradients each at least.
    assert sum(s[1] for s in sync) >= 200 * 2
    assert run_accuracy([procs.stdout(w) for w in clusters['sync'][1]],
                        'sync') > 0.9
