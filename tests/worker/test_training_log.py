"""What a worker reports beyond the book's lines
(ps_cluster/worker/training_log.py), in-process: where it starts, its pace, its
totals, and the chief's summaries, written by a real Supervisor into event
files that are read back."""

import contextlib
import glob
import os
import re
import types

import numpy as np

import mnist_data
from ps_cluster.worker import training_log as training_log_module
from ps_cluster.worker.staleness import Staleness
from ps_cluster.worker.training_log import TrainingLog

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
import tensorflow.compat.v1 as tf  # noqa: E402

tf.disable_v2_behavior()

# Validation and test splits of 25 and 50 images; accuracy_on() gives each
# an accuracy of its own, so that the summaries tell them apart.
MNIST = mnist_data.Datasets(
    train=None,
    validation=mnist_data.Split(np.zeros((25, mnist_data.IMAGE_PIXELS)),
                                np.eye(10)[np.zeros(25, int)]),
    test=mnist_data.Split(np.zeros((50, mnist_data.IMAGE_PIXELS)),
                          np.eye(10)[np.zeros(50, int)]))


def accuracy_on(split):
    return len(split.images) / 100


@contextlib.contextmanager
def chief(logdir=None):
    """The chief's Supervisor, as the scripts make it, and its session;
    stopped at the end."""
    with tf.Graph().as_default():
        global_step = tf.train.get_or_create_global_step()
        sv = tf.train.Supervisor(
            is_chief=True, logdir=logdir,
            init_op=tf.global_variables_initializer(),
            global_step=global_step, save_model_secs=0)
    sess = sv.prepare_or_wait_for_session('', start_standard_services=False)
    try:
        yield sv, sess
    finally:
        sv.stop()


def training_log(sv, sess, global_step, task_index, accuracy=accuracy_on,
                 staleness_dir=None):
    """The log as cluster_utils.training_log() makes it, for async."""
    return TrainingLog(sv, sess, global_step, task_index, accuracy, MNIST,
                       Staleness(drops_stale=False), staleness_dir)


def scalars(logdir):
    """[(global step, tag, value)] of the scalars in logdir's event files,
    in the order written."""
    return [(event.step, value.tag, value.simple_value)
            for event, value in summary_values(logdir)
            if value.HasField('simple_value')]


def histograms(logdir):
    """[(global step, tag, HistogramProto)] in logdir's event files."""
    return [(event.step, value.tag, value.histo)
            for event, value in summary_values(logdir)
            if value.HasField('histo')]


def summary_values(logdir):
    return [(event, value)
            for path in sorted(glob.glob(os.path.join(logdir, 'events.*')))
            for event in tf.train.summary_iterator(path)
            for value in event.summary.value]


def test_it_says_where_it_starts(capsys):
    with chief() as (sv, sess):
        training_log(sv, sess, 40, 2)
    assert capsys.readouterr().out == 'worker=2, starting at global_step=40\n'


def test_the_chief_shows_where_the_model_lives_in_tensorboard_too(
        tmp_path, capsys):
    where = ['/job:ps/task:0 (ps0:1) holds global_step: 8 bytes, 0.0% of '
             'the model',
             '/job:ps/task:1 (ps1:1) holds b, w: 31,400 bytes, 100.0% of '
             'the model']
    with chief(str(tmp_path)) as (sv, sess):
        TrainingLog(sv, sess, 40, 0, accuracy_on, MNIST,
                    Staleness(drops_stale=False), placement=where)
    assert capsys.readouterr().out.splitlines() == [
        '/job:worker/task:0: ' + where[0], '/job:worker/task:0: ' + where[1],
        'worker=0, starting at global_step=40']
    [(event, value)] = summary_values(str(tmp_path))
    assert (event.step, value.tag) == (40, 'placement')
    assert value.metadata.plugin_data.plugin_name == 'text'
    assert [line.decode() for line in tf.make_ndarray(value.tensor)] == where


def test_progress_every_few_seconds(capsys, monkeypatch):
    # The log's clock is the test's: seconds pass when the test says so.
    now = [1000.0]
    monkeypatch.setattr(training_log_module, 'time',
                        types.SimpleNamespace(monotonic=lambda: now[0]))
    every = TrainingLog.PROGRESS_EVERY_SECS
    with chief() as (sv, sess):
        log = training_log(sv, sess, 0, 1)
        capsys.readouterr()
        now[0] += every / 2
        log.step(3, 1, 2.0, 0)
        assert capsys.readouterr().out == ''  # too soon
        now[0] += every / 2
        log.step(12, 10, 2.0, 0)
        assert capsys.readouterr().out == (
            'worker=1, global_step=12, local_step=10, %.0f steps/s\n'
            % (10 / every))
        # The next one, PROGRESS_EVERY_SECS later.
        now[0] += every / 2
        log.step(13, 11, 2.0, 0)
        assert capsys.readouterr().out == ''


def test_loss_every_summary_steps_of_its_own(tmp_path):
    with chief(str(tmp_path)) as (sv, sess):
        log = training_log(sv, sess, 100, 0)
        # (global step, local step, loss): a loss each time the local step
        # passes a multiple of 50, at the global step; once for a
        # session.run that passes two (150 and 200).
        for global_step, local_step, loss in [
                (130, 30, 4.0), (149, 49, 3.0), (150, 50, 2.5), (199, 99, 2.0),
                (230, 130, 1.5), (340, 240, 1.25)]:
            log.step(global_step, local_step, loss, 0)
    assert scalars(str(tmp_path)) == [
        (150, 'loss', 2.5), (230, 'loss', 1.5), (340, 'loss', 1.25)]


def test_accuracies_writes_validation_and_test_accuracy(tmp_path):
    with chief(str(tmp_path)) as (sv, sess):
        training_log(sv, sess, 0, 0).accuracies(120)
    assert sorted(scalars(str(tmp_path))) == [
        (120, 'test_accuracy', 0.5), (120, 'validation_accuracy', 0.25)]


def test_final_says_the_totals_and_staleness_and_writes_them(tmp_path,
                                                              capsys):
    staleness_dir = str(tmp_path / 'staleness' / 'worker_3')
    with chief(str(tmp_path)) as (sv, sess):
        log = training_log(sv, sess, 100, 3, staleness_dir=staleness_dir)
        # Three session.runs of 5, 5 and 10 steps, 0, 2 and 1 updates stale.
        for local_step, staleness in [(5, 0), (10, 2), (20, 1)]:
            log.step(100 + local_step, local_step, 1.0, staleness)
        capsys.readouterr()
        log.final(180, 0.875)
    assert re.fullmatch(r'worker=3, local_steps=20, global_step=180, '
                        r'train_seconds=\d+\.\d, steps_per_sec=\d+\.\d\n'
                        r'worker=3, gradients=20, applied=20, dropped=0, '
                        r'staleness mean=1.00 \(0:1 1:1 2:1\)\n',
                        capsys.readouterr().out)
    assert scalars(str(tmp_path)) == [(180, 'test_accuracy', 0.875)]
    histogram, = histograms(staleness_dir)
    assert histogram[:2] == (180, 'staleness')
    assert list(histogram[2].bucket) == [1, 1, 1]
    assert list(histogram[2].bucket_limit) == [0.5, 1.5, 2.5]


def test_a_worker_without_summaries_writes_its_staleness(tmp_path, capsys):
    # As a worker other than the chief: no Supervisor writer of its own.
    (tmp_path / 'a_file').write_text('')
    with chief() as (sv, sess):
        training_log(sv, sess, 0, 1,
                     staleness_dir=str(tmp_path / 'worker_1')).final(0, 0.5)
        training_log(sv, sess, 0, 2, staleness_dir=str(
            tmp_path / 'a_file' / 'worker_2')).final(0, 0.5)
    histogram, = histograms(str(tmp_path / 'worker_1'))
    assert histogram[:2] == (0, 'staleness') and histogram[2].num == 0
    # One that cannot write says so, and ends as it would.
    assert re.search(r'^worker=2: cannot write its staleness to '
                     r'\S+/a_file/worker_2: ', capsys.readouterr().out, re.M)


def test_without_a_logdir_nothing_is_written(tmp_path, capsys, monkeypatch):
    measured = []
    monkeypatch.chdir(tmp_path)
    with chief() as (sv, sess):
        assert sv.summary_writer is None
        log = training_log(sv, sess, 0, 0, measured.append)
        log.step(50, 50, 1.0, 0)
        log.accuracies(50)
        log.final(50, 0.5)
    # Not even measured; the lines are said all the same.
    assert measured == [] and os.listdir(tmp_path) == []
    assert re.fullmatch(r'worker=0, starting at global_step=0\nworker=0, '
                        r'local_steps=50, global_step=50, .*\n'
                        r'worker=0, gradients=50, .*\n',
                        capsys.readouterr().out)


def test_the_chief_says_how_far_the_run_is_and_how_long_it_has_left(
        capsys, monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(training_log_module, 'time',
                        types.SimpleNamespace(monotonic=lambda: now[0]))
    with chief() as (sv, sess):
        # Its own 3 epochs of 10 steps, as the book's async workers walk,
        # in a run of 3 workers, which ends at 90 if not sooner.
        log = TrainingLog(sv, sess, 0, 0, accuracy_on, MNIST,
                          Staleness(drops_stale=False), epochs=3,
                          steps_per_epoch=10, last_step=90, own_epochs=True)
        capsys.readouterr()
        now[0] += 5
        log.step(2, 1, 2.0, 0)  # its first run waited for the connections
        now[0] += 1
        log.step(9, 5, 2.0, 0)  # the first epoch: 25 steps left, at 4 a s
        now[0] += 1
        log.step(12, 7, 2.0, 0)  # the same epoch: nothing
        now[0] += 1
        log.step(20, 10, 2.0, 0)  # the second: 20 left, at 3 a second
        assert capsys.readouterr().out == (
            'worker=0, global_step=9, local_step=5, 1 steps/s, epoch 1 of 3, '
            '6 s left\n'
            'worker=0, global_step=20, local_step=10, 1 steps/s, epoch 2 of '
            '3, 7 s left\n')
        # Resumed at 80 of 90: it starts its epochs again, but the run
        # ends at 90 first, 10 steps away at 4 a second.
        log = TrainingLog(sv, sess, 80, 0, accuracy_on, MNIST,
                          Staleness(drops_stale=False), epochs=3,
                          steps_per_epoch=10, last_step=90, own_epochs=True)
        capsys.readouterr()
        log.step(80, 1, 2.0, 0)
        now[0] += 1
        log.step(84, 2, 2.0, 0)
        assert capsys.readouterr().out.endswith(', epoch 3 of 3, 2 s left\n')
        # A run that ends at a global step, sync's: 600, at its global
        # pace.
        log = TrainingLog(sv, sess, 100, 0, accuracy_on, MNIST,
                          Staleness(drops_stale=True), epochs=3,
                          steps_per_epoch=200, last_step=600)
        capsys.readouterr()
        now[0] += 1
        log.step(230, 130, 2.0, 0)
        now[0] += 1
        log.step(360, 131, 2.0, 0)  # 130 a second, 240 to go
        assert capsys.readouterr().out == (
            'worker=0, global_step=360, local_step=131, 66 steps/s, epoch 2 '
            'of 3, 2 s left\n')
        # Slower since: 140 global steps in 101 s, 230 to go; a line, 10 s
        # after the last.
        now[0] += 100
        log.step(370, 132, 2.0, 0)
        assert capsys.readouterr().out.endswith(
            ', epoch 2 of 3, 2 min 46 s left\n')
