"""The evaluator (ps_cluster/evaluator/evaluator.py), in-process: it follows
the checkpoints that a Saver writes in a logdir as the chief's does, measures
each, and ends at the run's last step, at a timeout, or when the chief has left
on purpose."""

import contextlib
import glob
import math
import os
import re
import threading
import time

import numpy as np
import pytest

import mnist_data
from ps_cluster.deadlines import Limit
from ps_cluster.evaluator import evaluator
from ps_cluster.exits import TaskFailed
from ps_cluster.logdir import CHIEF_DONE, CHIEF_LEFT, Logdir

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
import tensorflow.compat.v1 as tf  # noqa: E402

tf.disable_v2_behavior()

PIXELS = mnist_data.IMAGE_PIXELS
# 20 images whose first 10 pixels are their one-hot label, two of each
# class: w = k * eye (b = 0) classifies them all right, w = 0 a tenth.
LABELS = np.arange(20) % 10
SPLIT = mnist_data.Split(
    np.eye(PIXELS, dtype=np.float32)[LABELS],
    np.eye(10, dtype=np.float32)[LABELS])
MEASURED = re.compile(r'^evaluator: global_step=(\d+), loss=(\S+), '
                      r'accuracy=(\S+) \((\S+)\)$', re.M)


def model(images):
    w = tf.Variable(tf.random_normal([PIXELS, 10]), name='w')
    b = tf.Variable(tf.random_normal([10]), name='b')
    return tf.matmul(images, w) + b


def loss_and_accuracy(logits, labels):
    loss = tf.reduce_mean(tf.nn.softmax_cross_entropy_with_logits_v2(
        labels=labels, logits=logits))
    correct = tf.equal(tf.argmax(logits, 1), tf.argmax(labels, 1))
    return loss, tf.reduce_mean(tf.cast(correct, tf.float32))


@contextlib.contextmanager
def chief(logdir):
    """save(step, k, held=step): as the chief saves, model.ckpt-STEP in
    logdir, with w = k * eye, b = 0 and the global step `held`."""
    with tf.Graph().as_default() as graph:
        w = tf.Variable(tf.zeros([PIXELS, 10]), name='w')
        tf.Variable(tf.zeros([10]), name='b')
        global_step = tf.train.get_or_create_global_step()
        saver = tf.train.Saver(save_relative_paths=True)
        init = tf.global_variables_initializer()
    with tf.Session(graph=graph) as sess:
        sess.run(init)

        def save(step, k, held=None):
            w.load(k * np.eye(PIXELS, 10), sess)
            global_step.load(step if held is None else held, sess)
            saver.save(sess, os.path.join(logdir, 'model.ckpt'),
                       global_step=step)
        yield save


def follow(logdir, last_step, timeout=30, on_last=None,
           chief_answers=lambda: False):
    evaluator.follow(model, loss_and_accuracy, SPLIT, 'validation', logdir,
                     last_step, Limit(timeout, '--eval_timeout'), PIXELS,
                     on_last, chief_answers)


def evaluated(logdir):
    """{tag: [(global step, value)]} of the evaluator's summaries."""
    tags = {}
    for path in glob.glob(os.path.join(logdir, 'eval', 'events.*')):
        for event in tf.train.summary_iterator(path):
            for value in event.summary.value:
                tags.setdefault(value.tag, []).append(
                    (event.step, value.simple_value))
    return tags


@pytest.fixture(autouse=True)
def quick_polls(monkeypatch):
    monkeypatch.setattr(evaluator, 'POLL_SECS', 0.05)


def test_measures_each_checkpoint_to_the_last_step(tmp_path, capsys):
    logdir = str(tmp_path)
    with chief(logdir) as save:
        for step, k in ((10, 0), (20, 1), (30, 10)):
            save(step, k)
    last = []
    follow(logdir, 30, on_last=lambda *args: last.append(args))
    out = capsys.readouterr().out
    assert out.startswith(
        'evaluator: following the checkpoints of %s, on the validation '
        'split (20 images), to global_step=30\n' % logdir)
    lines = MEASURED.findall(out)
    assert [(int(step), path) for step, _, _, path in lines] == [
        (step, os.path.join(logdir, 'model.ckpt-%d' % step))
        for step in (10, 20, 30)]
    # The cross-entropy of k * eye, ln(1 + 9 exp(-k)); a tenth right at
    # k = 0 (class 0 wins the ties), all of them after.
    assert [float(loss) for _, loss, _, _ in lines] == pytest.approx(
        [math.log(1 + 9 * math.exp(-k)) for k in (0, 1, 10)], rel=1e-3)
    assert [float(a) for _, _, a, _ in lines] == [0.1, 1.0, 1.0]
    assert len(out.splitlines()) == 4
    summaries = evaluated(logdir)
    assert summaries['accuracy'] == [(10, pytest.approx(0.1)),
                                     (20, 1.0), (30, 1.0)]
    assert [step for step, _ in summaries['loss']] == [10, 20, 30]
    # The last checkpoint's variables, by name.
    [(step, values)] = last
    assert step == 30 and sorted(values) == ['b', 'global_step', 'w']
    assert values['global_step'] == 30
    assert np.array_equal(values['w'], 10 * np.eye(PIXELS, 10))
    assert np.array_equal(values['b'], np.zeros(10))


def test_a_step_that_two_checkpoints_hold_is_measured_once(tmp_path,
                                                          capsys):
    # An async chief names a checkpoint after the step it read, and others
    # may update before it saves: model.ckpt-29 holds step 30, as the next,
    # model.ckpt-30, does.
    logdir = str(tmp_path)
    with chief(logdir) as save:
        save(10, 0)
        save(29, 10, held=30)
        save(30, 10)
    follow(logdir, 30)
    assert [s for s, *_ in MEASURED.findall(capsys.readouterr().out)] == [
        '10', '30']
    assert [step for step, _ in evaluated(logdir)['accuracy']] == [10, 30]


def test_a_checkpoint_beyond_the_last_step_ends_it(tmp_path, capsys):
    with chief(str(tmp_path)) as save:
        save(35, 1)
    follow(str(tmp_path), 30)
    assert [s for s, *_ in MEASURED.findall(capsys.readouterr().out)] == [
        '35']


def test_it_waits_for_the_next_checkpoint(tmp_path, capsys):
    logdir = str(tmp_path)
    waited = []

    def chief_goes_on():
        # Step 30 once the evaluator has measured step 20, and looks for
        # more.
        with chief(logdir) as save:
            save(10, 0)
            save(20, 1)
            deadline = time.time() + 30
            while not waited and time.time() < deadline:
                try:
                    if (20, 1.0) in evaluated(logdir).get('accuracy', []):
                        waited.append(True)
                except tf.errors.DataLossError:  # read as it was written
                    pass
                time.sleep(0.05)
            save(30, 10)

    going_on = threading.Thread(target=chief_goes_on)
    going_on.start()
    try:
        follow(logdir, 30)
    finally:
        going_on.join()
    assert waited
    assert [s for s, *_ in MEASURED.findall(capsys.readouterr().out)] == [
        '10', '20', '30']


@pytest.mark.parametrize('damage', ['garbage', 'removed'])
def test_a_checkpoint_that_cannot_be_read_is_skipped(tmp_path, capsys,
                                                     damage):
    logdir = str(tmp_path)
    with chief(logdir) as save:
        for step, k in ((10, 0), (20, 1), (30, 10)):
            save(step, k)
    # Still listed in the checkpoint state.
    index = tmp_path / 'model.ckpt-20.index'
    if damage == 'garbage':
        index.write_bytes(b'not a checkpoint index')
    else:
        index.unlink()
    follow(logdir, 30)
    # The following line, 10 measured, 20 skipped in one line, 30 measured.
    lines = capsys.readouterr().out.splitlines()
    assert [MEASURED.match(lines[i]).group(1) for i in (1, 3)] == ['10', '30']
    assert re.fullmatch(r'evaluator: skipped %s, which cannot be read \(.+\)'
                        % re.escape(str(tmp_path / 'model.ckpt-20')), lines[2])
    assert len(lines) == 4


def test_no_new_checkpoint_for_the_timeout_fails(tmp_path, capsys):
    logdir = str(tmp_path)
    with chief(logdir) as save:
        save(10, 0)
    with pytest.raises(TaskFailed) as failed:
        follow(logdir, 30, timeout=0.5)
    assert failed.value.message == (
        'no new checkpoint in %s, and no answer from the chief, '
        'for 0.5 s (--eval_timeout), before '
        'global_step=30' % logdir)
    # It measured the one there was.
    assert [s for s, *_ in MEASURED.findall(capsys.readouterr().out)] == [
        '10']


def test_no_checkpoint_at_all_for_the_timeout_fails(tmp_path):
    with pytest.raises(TaskFailed) as failed:
        follow(str(tmp_path), 30, timeout=0.5)
    assert failed.value.message == (
        'no new checkpoint in %s, and no answer from the chief, '
        'for 0.5 s (--eval_timeout), before '
        'global_step=30' % tmp_path)


def test_a_run_that_ended_short_ends_it_at_the_chiefs_last_step(
        tmp_path, capsys):
    # A worker that failed took its steps with it: the chief ended at 20.
    logdir = str(tmp_path)
    last = []
    with chief(logdir) as save:
        save(10, 0)
        save(20, 1)
    Logdir(logdir, '/job:worker/task:0').say(CHIEF_DONE, '20')
    started = time.time()
    follow(logdir, 30, timeout=60, on_last=lambda *args: last.append(args))
    assert time.time() - started < 30  # at a poll, not the timeout
    assert [s for s, *_ in MEASURED.findall(capsys.readouterr().out)] == [
        '10', '20']
    [(step, values)] = last
    assert step == 20 and values['global_step'] == 20


def test_the_chiefs_last_step_waits_for_its_checkpoint(tmp_path, capsys):
    # The word may come before the checkpoint it names is found.
    logdir = str(tmp_path)
    last = []
    with chief(logdir) as save:
        save(10, 0)
        Logdir(logdir, '/job:worker/task:0').say(CHIEF_DONE, '20')
        saving = threading.Timer(0.5, save, (20, 1))
        saving.start()
        follow(logdir, 30, timeout=60, on_last=lambda *args: last.append(args))
        saving.join()
    assert [step for step, _ in last] == [20]


def test_it_waits_while_the_chief_answers(tmp_path, capsys):
    # No checkpoint for 4 timeouts, the chief alive: it waits; the chief
    # ends at 35, past the last step, as an async run resumed may.
    logdir = str(tmp_path)
    last = []
    with chief(logdir) as save:
        save(10, 0)

        def end():
            save(30, 1)
            save(35, 1)
            Logdir(logdir, '/job:worker/task:0').say(CHIEF_DONE, '35')
        ending = threading.Timer(2, end)
        ending.start()
        follow(logdir, 30, timeout=0.5, chief_answers=lambda: True,
               on_last=lambda *args: last.append(args))
        ending.join()
    assert [step for step, _ in last] == [35]


def test_the_chiefs_word_after_a_missed_answer_is_heeded(tmp_path,
                                                       capsys):
    # At the last step, the chief not answering one probe as it saves its
    # last checkpoint, 35, and says so: the evaluator ends there.
    logdir = str(tmp_path)
    last = []
    with chief(logdir) as save:
        save(30, 1)

        def busy_chief():
            if not last:
                save(35, 1)
                Logdir(logdir, '/job:worker/task:0').say(CHIEF_DONE, '35')
                last.append('saved')
            return False
        follow(logdir, 30, timeout=60, chief_answers=busy_chief,
               on_last=lambda *args: last.append(args))
    assert [step for step, _ in last[1:]] == [35]


def test_a_chief_that_left_ends_it(tmp_path, capsys):
    logdir = str(tmp_path)
    with chief(logdir) as save:
        save(10, 0)
    # After this process started: this run's chief.
    Logdir(logdir, '/job:worker/task:0').say(CHIEF_LEFT, 'interrupted')
    started = time.time()
    with pytest.raises(TaskFailed) as failed:
        follow(logdir, 30, timeout=60)
    assert failed.value.message == (
        'the chief, /job:worker/task:0, left before global_step=30: '
        '"interrupted"')
    # At the first poll, not the timeout.
    assert time.time() - started < 30
    assert [s for s, *_ in MEASURED.findall(capsys.readouterr().out)] == [
        '10']


def test_a_chief_that_left_before_it_started_is_an_earlier_runs(tmp_path):
    logdir = str(tmp_path)
    Logdir(logdir, '/job:worker/task:0').say(CHIEF_LEFT, 'interrupted')
    os.utime(tmp_path / 'chief_left', (1000, 1000))  # long before
    with pytest.raises(TaskFailed) as failed:
        follow(logdir, 30, timeout=0.5)
    assert failed.value.message.startswith('no new checkpoint in ')
