"""Where a worker's model comes from (ps_cluster/worker/session_start.py):
in-process, with servers of one cluster in the test's process, the chief
initializes a new model, restores the last checkpoint, or joins the live
model on the ps, and says which; a damaged checkpoint, or a chief that never
initializes, fails the worker in one line. In a cluster of processes, a
checkpoint that cannot be restored ends every worker (restoring and joining
the live model there: test_logdir.py and test_recoverable_session.py)."""

import contextlib
import os
import re
import threading
import time

import pytest

from conftest import (SHORT_RUN, START_UP, assert_clean_exit,
                      assert_one_error_line, small_disks)

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
import tensorflow.compat.v1 as tf  # noqa: E402

from ps_cluster import errors, server  # noqa: E402
from ps_cluster.worker import session_start  # noqa: E402
from ps_cluster.deadlines import Deadline, Limit, Outage  # noqa: E402
from ps_cluster.logdir import Logdir  # noqa: E402
from ps_cluster.sources import Place  # noqa: E402
from ps_cluster.worker.stall_watch import StallWatch  # noqa: E402
from ps_cluster.exits import TaskFailed  # noqa: E402

import small_model  # noqa: E402

tf.disable_v2_behavior()


@pytest.fixture
def cluster(shared_cluster):
    """A ps and two workers, each a server of this process: the cluster,
    and the servers by (job, index)."""
    spec = shared_cluster(1, 2)
    return spec, {(job, i): small_model.server(spec, job, i)
                  for job, i in (('ps', 0), ('worker', 0), ('worker', 1))}


def supervisor(cluster, index, logdir=None, initializes=True):
    """What worker `index` of the scripts builds, in a graph of its own: the
    model (of 4 pixels and 2 classes) under replica_device_setter, and the
    Supervisor; and its training step."""
    with tf.Graph().as_default():
        global_step, train_op = small_model.training_step(cluster, index)
        return tf.train.Supervisor(
            is_chief=index == 0, logdir=logdir,
            init_op=(tf.global_variables_initializer() if initializes
                     else tf.no_op()),
            global_step=global_step,
            saver=tf.train.Saver(save_relative_paths=True),
            recovery_wait_secs=1, save_model_secs=0), train_op


def open_session(cluster, sv, index, logdir=None, timeout=10,
                 reopened=False, coord=None):
    """session_start.open_session() as worker `index` calls it, on its own
    server, its model's graph the default one, as in its own process; a
    session's coordinator, `coord`, holds what its threads met."""
    spec, servers = cluster
    place = Place(spec, 'worker', index)
    watch = StallWatch(None, place, Limit(60, '--stall_timeout'),
                       Outage(Limit(60, '--ps_timeout')))
    with sv.global_step.graph.as_default():
        return session_start.open_session(
            sv, servers['worker', index].target,
            server.session_config('worker', index), spec, watch,
            coord or tf.train.Coordinator(),
            Deadline(Limit(timeout, '--startup_timeout')),
            logdir and Logdir(logdir, place.name), reopened)


def is_live(cluster):
    """Whether a chief started now would find the model ready on the ps,
    as open_session() asks its Supervisor's SessionManager."""
    spec, servers = cluster
    sv, _ = supervisor(spec, 0)
    try:
        sv.session_manager.wait_for_session(
            servers['worker', 0].target,
            config=server.session_config('worker', 0),
            max_wait_secs=0).close()
        return True
    except tf.errors.DeadlineExceededError:
        return False


def test_the_chief_initializes_a_new_model_which_the_others_find(
        cluster, capsys):
    assert not is_live(cluster)
    chief, _ = supervisor(cluster[0], 0)
    sess = open_session(cluster, chief, 0)
    assert capsys.readouterr().out == 'worker=0: initialized the model\n'
    assert is_live(cluster)
    # Worker 1 finds the chief's model ready, and has nothing to say.
    worker, _ = supervisor(cluster[0], 1)
    worker_sess = open_session(cluster, worker, 1)
    assert worker_sess.run(worker.global_step) == 0
    assert capsys.readouterr().out == ''
    for sv, session in ((chief, sess), (worker, worker_sess)):
        sv.stop()  # first: its threads run in the session
        session.close()


@pytest.mark.parametrize('with_logdir, why', [
    (False, 'without --logdir there is no checkpoint to restore'),
    (True, 'no checkpoint in --logdir yet')])
def test_a_chief_that_lost_the_model_says_why_it_initializes_again(
        cluster, capsys, tmp_path, with_logdir, why):
    logdir = str(tmp_path) if with_logdir else None
    sv, _ = supervisor(cluster[0], 0, logdir)
    sess = open_session(cluster, sv, 0, logdir, reopened=True)
    assert capsys.readouterr().out == (
        'worker=0: initialized the model again: %s\n' % why)
    sv.stop()
    sess.close()


def test_the_chief_restores_the_last_checkpoint(cluster, capsys, tmp_path):
    # Saved as the chief saves it, by a session of no cluster.
    with tf.Graph().as_default(), tf.Session() as saving:
        tf.Variable(7, dtype=tf.int64, name='global_step')
        tf.Variable(tf.zeros([4, 2]), name='w')
        tf.Variable(tf.zeros([2]), name='b')
        saving.run(tf.global_variables_initializer())
        checkpoint = tf.train.Saver(save_relative_paths=True).save(
            saving, str(tmp_path / 'model.ckpt'), global_step=7)
    sv, _ = supervisor(cluster[0], 0, str(tmp_path))
    sess = open_session(cluster, sv, 0, str(tmp_path))
    assert capsys.readouterr().out == (
        'worker=0: restored the model from %s at global_step=7, on 1 ps and '
        '2 workers\n' % checkpoint)
    assert sess.run(sv.global_step) == 7
    sv.stop()
    sess.close()


def test_the_chief_joins_the_live_model_not_its_older_checkpoint(
        cluster, capsys, tmp_path):
    logdir = str(tmp_path)
    sv, train_op = supervisor(cluster[0], 0, logdir)
    sess = open_session(cluster, sv, 0, logdir)
    for _ in range(2):
        sess.run(train_op)
    sv.saver.save(sess, sv.save_path, global_step=sv.global_step)
    sess.run(train_op)
    sv.stop()
    sess.close()
    capsys.readouterr()
    # The chief started again, while the ps kept the model of step 3.
    sv, _ = supervisor(cluster[0], 0, logdir)
    sess = open_session(cluster, sv, 0, logdir)
    assert capsys.readouterr().out == (
        'worker=0: joined the live model on the ps at global_step=3\n')
    assert sess.run(sv.global_step) == 3
    sv.stop()
    sess.close()


@pytest.mark.filterwarnings(
    'ignore::pytest.PytestUnhandledThreadExceptionWarning')
def test_a_chief_on_a_full_logdir_opens_its_session_and_says_so(
        cluster, capsys, tmp_path):
    # The logdir full before the chief starts, or as a ps restarted: the
    # graph the chief writes there costs one line, not the session.
    logdir = tmp_path / 'logdir'
    with small_disks([logdir], '64k'):
        with open(logdir / 'filler', 'wb', buffering=0) as filler:
            with contextlib.suppress(OSError):
                while True:
                    filler.write(bytes(4096))
        sv, train_op = supervisor(cluster[0], 0, str(logdir))
        sess = open_session(cluster, sv, 0, str(logdir))
        sess.run(train_op)
        sess.close()
        # Its summaries cannot be written either: said by the scripts as
        # their writer's thread fails (test_logdir.py).
        with contextlib.suppress(RuntimeError):
            sv.stop()
    out, err = capsys.readouterr()
    assert out == 'worker=0: initialized the model\n'
    assert re.fullmatch(
        r'/job:worker/task:0: error: cannot write the graph in --logdir=%s '
        r'\(%s\.tmp\w+; No space left on device\); training goes on\n'
        % (re.escape(str(logdir)), re.escape(str(logdir / 'graph.pbtxt'))),
        err)


def test_a_model_not_ready_once_initialized_is_a_lost_ps(cluster):
    # As when a ps restarts while the chief initializes the model: its
    # SessionManager's RuntimeError is a lost ps's, which a recovery waits
    # for.
    sv, _ = supervisor(cluster[0], 0, initializes=False)
    with pytest.raises(tf.errors.AbortedError, match='^the model is not '
                       'ready once initialized: Init operations did not '
                       'make model ready'):
        open_session(cluster, sv, 0)
    sv.stop()


def test_a_damaged_checkpoint_fails_the_chief(cluster, tmp_path):
    (tmp_path / 'checkpoint').write_text(
        'model_checkpoint_path: "model.ckpt-10"\n')
    for suffix in ('index', 'data-00000-of-00001', 'meta'):
        (tmp_path / ('model.ckpt-10.' + suffix)).write_bytes(os.urandom(512))
    sv, _ = supervisor(cluster[0], 0, str(tmp_path))
    with pytest.raises(TaskFailed) as failed:
        open_session(cluster, sv, 0, str(tmp_path))
    sv.stop()
    # In the parentheses, TensorFlow's own line of what it found.
    assert failed.value.message == (
        'cannot restore the checkpoint %s (not an sstable (bad magic '
        'number)): move it away, or choose another --logdir'
        % (tmp_path / 'model.ckpt-10'))
    assert not is_live(cluster)


def test_a_worker_whose_chief_never_initializes_the_model_fails(cluster):
    sv, _ = supervisor(cluster[0], 1)
    with pytest.raises(TaskFailed) as failed:
        open_session(cluster, sv, 1, timeout=1)
    sv.stop()
    assert failed.value.message == (
        'the chief, /job:worker/task:0 (%s), did not initialize the model '
        'within 1 s (--startup_timeout)' % cluster[0].task_address('worker',
                                                                  0))


def test_a_worker_waiting_for_the_model_raises_a_failure_stored(cluster):
    # The chief went away, as a worker's Watchdog finds: the main thread
    # leaves its wait and raises it, well before the timeout.
    sv, _ = supervisor(cluster[0], 1)
    coord = tf.train.Coordinator()
    threading.Timer(1, errors.fail, (coord, 'the chief went away')).start()
    started = time.time()
    with pytest.raises(TaskFailed, match='^the chief went away$'):
        open_session(cluster, sv, 1, timeout=60, coord=coord)
    assert time.time() - started < 10


def test_a_worker_waiting_for_the_model_stopped_without_a_failure_says_so(
        cluster):
    # A coordinator stopped on purpose, with nothing stored: no TypeError
    # of a `raise None`.
    sv, _ = supervisor(cluster[0], 1)
    coord = tf.train.Coordinator()
    threading.Timer(1, coord.request_stop).start()
    with pytest.raises(TaskFailed,
                       match='^stopped before the model was ready$'):
        open_session(cluster, sv, 1, timeout=60, coord=coord)


@pytest.mark.slow
def test_unreadable_checkpoint_ends_every_worker(procs, free_ports,
                                                 small_data, tmp_path):
    logdir = tmp_path / 'logdir'
    logdir.mkdir()
    (logdir / 'checkpoint').write_text(
        'model_checkpoint_path: "model.ckpt-10"\n')
    for suffix in ('index', 'data-00000-of-00001', 'meta'):
        (logdir / ('model.ckpt-10.' + suffix)).write_bytes(os.urandom(512))
    ports = free_ports(4)
    flags = ('--data_dir=' + small_data, '--logdir=' + str(logdir),
             *SHORT_RUN)

    def task(job, index):
        return procs.script('async', job, index, ports[:1], ports[1:], *flags)
    ps, chief, worker1 = task('ps', 0), task('worker', 0), task('worker', 1)
    # Worker 1 may wait for the model when the chief leaves, or come after;
    # worker 2 comes after, and counts no departure of the chief's.
    procs.wait_all([chief], START_UP)
    workers = [chief, worker1, task('worker', 2)]
    procs.wait_all(workers + [ps], START_UP)
    assert_one_error_line(procs, workers[0], 1,
                          'cannot restore the checkpoint %s'
                          % (logdir / 'model.ckpt-10'),
                          'move it away, or choose another --logdir')
    for worker in workers[1:]:
        assert_one_error_line(procs, worker, 1, 'the chief',
                              'went away before the model was ready')
    assert_clean_exit(procs, ps, 0)
