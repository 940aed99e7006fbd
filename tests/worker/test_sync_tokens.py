"""Sync's tokens (ps_cluster/worker/sync_tokens.py): in-process, with servers
of one cluster in the test's process and the book's SyncReplicasOptimizer, the
token ops a worker runs when another departs, when it is done, and to free one
that waits, and the chief's start of the updates in a new session. In a cluster
of processes, a sync worker started again rejoins the run; a lost worker's
token is put back in test_liveness.py."""

import os
import signal
import time

import pytest

from conftest import LONG_RUN, START_UP, assert_clean_exit, final_accuracies

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
import tensorflow.compat.v1 as tf  # noqa: E402

from ps_cluster import server  # noqa: E402
from ps_cluster.worker.sync_tokens import SyncTokens  # noqa: E402

import small_model  # noqa: E402
from small_model import step_and_loss  # noqa: E402

tf.disable_v2_behavior()

NUM_WORKERS = 2


@pytest.fixture
def chief(shared_cluster):
    """The scripts' sync chief, of a cluster of a ps and two workers, the ps
    and the chief servers of this process: its Supervisor, its session, and
    ops by name: train_op; tokens, the size of the token queue; SyncTokens
    as the chief builds them, of the last step 10 (running) or 0 (ended),
    and as worker 1 does (worker)."""
    cluster = shared_cluster()
    servers = [small_model.server(cluster, job, 0)
               for job in ('ps', 'worker')]
    with tf.Graph().as_default():
        with tf.device(tf.train.replica_device_setter(
                worker_device='/job:worker/task:0', cluster=cluster)):
            global_step, loss = step_and_loss()
            # One gradient an update, as with a backup worker: the chief's
            # own step makes one.
            optimizer = tf.train.SyncReplicasOptimizer(
                tf.train.GradientDescentOptimizer(0.1),
                replicas_to_aggregate=1, total_num_replicas=NUM_WORKERS)
            train_op = optimizer.minimize(loss, global_step=global_step)
            chief_queue_runner = optimizer.get_chief_queue_runner()
            init_token_op = optimizer.get_init_tokens_op()
            ops = dict(train_op=train_op,
                       tokens=optimizer._sync_token_queue.size())
            for name, is_chief, last_step in (('running', True, 10),
                                              ('ended', True, 0),
                                              ('worker', False, 10)):
                ops[name] = SyncTokens(optimizer, chief_queue_runner,
                                       init_token_op, is_chief, global_step,
                                       last_step, NUM_WORKERS)
        sv = tf.train.Supervisor(
            is_chief=True, init_op=tf.global_variables_initializer(),
            local_init_op=optimizer.chief_init_op,
            ready_for_local_init_op=optimizer.ready_for_local_init_op,
            global_step=global_step,
            saver=tf.train.Saver(save_relative_paths=True),
            recovery_wait_secs=1, save_model_secs=0)
    sess = sv.prepare_or_wait_for_session(
        servers[1].target, config=server.session_config('worker', 0))
    yield sv, sess, ops
    # The updates' loop waits in the session for gradients: closing it
    # cancels the wait.
    sv.request_stop()
    sess.close()
    sv.stop()


def test_a_worker_departed_before_the_last_step_is_gone(chief):
    _, sess, ops = chief
    assert sess.run(ops['tokens']) == 0
    assert ops['running'].on_departure(sess)
    # It may have taken a token with it: the chief puts one back.
    assert sess.run(ops['tokens']) == 1
    # Any other worker says so too, and leaves the tokens to the chief.
    assert ops['worker'].on_departure(sess)
    assert sess.run(ops['tokens']) == 1


def test_a_worker_departed_at_the_last_step_is_done(chief):
    _, sess, ops = chief
    assert not ops['ended'].on_departure(sess)
    assert sess.run(ops['tokens']) == 0


def test_a_worker_done_leaves_a_token_for_every_worker(chief):
    _, sess, ops = chief
    ops['worker'].release(sess)
    assert sess.run(ops['tokens']) == NUM_WORKERS


def test_freeing_a_waiting_worker_puts_in_one_token(chief):
    # What the chief puts back for a worker gone.
    _, sess, ops = chief
    sess.run(ops['worker'].add_token_op)
    assert sess.run(ops['tokens']) == 1


def test_the_chiefs_updates_apply_each_gradient_and_hand_out_tokens(chief):
    sv, sess, ops = chief
    # As the chief's SessionCreator calls its hooks in its first session:
    # nothing before the first run, which reads where training starts.
    ops['running'].after_create_session(sess, sv.coord)
    assert sess.run(ops['tokens']) == 0
    ops['running'].after_run(tf.train.SessionRunContext(None, sess), None)
    # The first step's token: one per gradient an update.
    assert sess.run(ops['tokens']) == 1
    sess.run(ops['train_op'])
    # The loop applies the chief's gradient, and a token for each worker.
    deadline = time.time() + 10
    while sess.run(ops['tokens']) != NUM_WORKERS and time.time() < deadline:
        time.sleep(0.05)
    assert sess.run([sv.global_step, ops['tokens']]) == [1, NUM_WORKERS]
    # Once a session; in a session after a lost ps, at once.
    ops['running'].after_run(tf.train.SessionRunContext(None, sess), None)
    assert sess.run(ops['tokens']) == NUM_WORKERS
    ops['running'].after_create_session(sess, sv.coord)
    assert sess.run(ops['tokens']) == NUM_WORKERS + 1


@pytest.mark.slow
def test_sync_worker_started_again_rejoins(procs, free_ports, small_data):
    ports = free_ports(4)
    # Slow enough that the others still train when it is back.
    flags = ['--data_dir=' + small_data] + LONG_RUN[1:] + [
        '--step_delay_ms=20', '--epochs=60']
    ps, workers = procs.cluster('sync', lambda n: ports, *flags)
    procs.wait_for_output(workers[2], r'^worker=2,epoch=1,', START_UP)
    os.kill(workers[2].pid, signal.SIGKILL)
    workers[2].wait()
    again = procs.script('sync', 'worker', 2, ports[:1], ports[1:], *flags)
    started = procs.wait_for_output(
        again, r'^worker=2, starting at global_step=(\d+)$', START_UP)
    assert int(started.group(1)) > 0
    procs.wait_all(workers[:2] + [again, ps], START_UP)
    for i, worker in enumerate(workers[:2] + [again]):
        assert i in final_accuracies(assert_clean_exit(procs, worker, 0))
    assert_clean_exit(procs, ps, 0)
