"""The evaluator: a task outside the cluster that follows the chief's
checkpoints as they appear, measures each on a split of the data, and ends
once it has measured the run's last checkpoint."""

import os
import time

import tensorflow.compat.v1 as tf

from ps_cluster import errors
from ps_cluster.exits import TaskFailed
from ps_cluster.logdir import CHIEF_DONE, CHIEF_LEFT, checkpoint_step, marker

# When this evaluator started, as the chief's markers in the logdir are
# timed: one left before then was left by an earlier run.
STARTED = time.time()
# How often it looks for a new checkpoint, and whether the chief left.
POLL_SECS = 2
# Without the chief's word, the chief is gone after this many polls' time
# with neither a checkpoint nor an answer of its: one probe can miss a busy
# chief that is still saving its last checkpoint.
SILENT_POLLS = 3


def follow(model, loss_and_accuracy, split, split_name, logdir, last_step,
           timeout, pixels, on_last=None, chief_answers=lambda: False,
           config=None):
    """Restores each new checkpoint in logdir into a graph of its own, and
    writes its loss and accuracy on split: one line, and summaries in
    logdir/eval. Returns once it has measured the run's last checkpoint: the
    one the chief said it ended its run at (short of last_step where a
    worker failed, past it in an async run resumed), or, with no word from
    the chief, one at last_step or beyond once the chief no longer answers;
    then calls on_last(step, {name: value}). Raises TaskFailed once the
    chief has left on purpose (it says why in logdir), or when for
    `timeout` (a Limit) no new checkpoint came and chief_answers() said
    no.
    model(images) and loss_and_accuracy(logits, labels) are the workers';
    a checkpoint that disappears or is half-written is skipped. config: the
    session's (the GPU it may use).
    """
    with tf.Graph().as_default() as graph, tf.Session(
            graph=graph, config=config) as sess:
        images = tf.placeholder(tf.float32, [None, pixels])
        labels = tf.placeholder(tf.float32, [None, split.labels.shape[1]])
        loss, accuracy = loss_and_accuracy(model(images), labels)
        global_step = tf.train.get_or_create_global_step()
        saver = tf.train.Saver()
        writer = tf.summary.FileWriter(os.path.join(logdir, 'eval'))
        print('evaluator: following the checkpoints of %s, on the %s split '
              '(%d images), to global_step=%d'
              % (logdir, split_name, len(split.images), last_step),
              flush=True)
        measured, heard, ended = -1, time.monotonic(), False

        def at_the_end():
            """Whether the run's last checkpoint is measured: the one the
            chief said it ended at; without its word, one at last_step or
            beyond once the chief has been silent SILENT_POLLS polls (an
            async run resumed goes on past last_step, to an epoch's
            start)."""
            done = marker(logdir, CHIEF_DONE, STARTED)
            if done:
                return measured >= int(done)
            return (measured >= last_step
                    and time.monotonic() - heard >= SILENT_POLLS * POLL_SECS)

        def waited_out():
            """Whether to stop waiting: at the end, once the chief left,
            or `timeout` after the last checkpoint or answer of the
            chief."""
            nonlocal heard, ended
            if chief_answers():
                heard = time.monotonic()
            ended = at_the_end()
            return (ended or marker(logdir, CHIEF_LEFT, STARTED) is not None
                    or time.monotonic() - heard >= timeout.secs)

        # checkpoints_iterator calls timeout_fn after each checkpoint, and
        # after each POLL_SECS without one.
        for latest in tf.train.checkpoints_iterator(
                logdir, timeout=POLL_SECS, timeout_fn=waited_out):
            heard = time.monotonic()
            # Each checkpoint the chief kept since the last one measured, not
            # only the latest: several may come between two polls.
            for path in _kept_since(logdir, measured, latest):
                try:
                    saver.restore(sess, path)
                except (tf.errors.NotFoundError, tf.errors.DataLossError,
                        tf.errors.InvalidArgumentError, ValueError) as e:
                    # ValueError: its files are gone, the chief keeps few.
                    print('evaluator: skipped %s, which cannot be read (%s)'
                          % (path, errors.what_went_wrong(e)), flush=True)
                    continue
                step, loss_value, accuracy_value = sess.run(
                    [global_step, loss, accuracy],
                    {images: split.images, labels: split.labels})
                # In async runs the step may move between the read that
                # names a checkpoint and its save: the one before may have
                # held this step, and this model, already.
                if step == measured:
                    continue
                measured = step
                print('evaluator: global_step=%d, loss=%s, accuracy=%s (%s)'
                      % (measured, loss_value, accuracy_value, path),
                      flush=True)
                writer.add_summary(tf.Summary(value=[
                    tf.Summary.Value(tag='loss', simple_value=loss_value),
                    tf.Summary.Value(tag='accuracy',
                                     simple_value=accuracy_value)]), measured)
                writer.flush()
            ended = at_the_end()
            if ended:
                break
        writer.close()
        # As decided in the loop: the chief's word may come after.
        if ended:
            if on_last:
                on_last(measured, {v.op.name: value for v, value in zip(
                    tf.global_variables(), sess.run(tf.global_variables()))})
            return
    reason = marker(logdir, CHIEF_LEFT, STARTED)
    if reason is not None:
        raise TaskFailed('the chief, /job:worker/task:0, left before '
                         'global_step=%d: "%s"' % (last_step, reason))
    raise TaskFailed('no new checkpoint in %s, and no answer from the chief, '
                     'for %s, before global_step=%d'
                     % (logdir, timeout, last_step))


def _kept_since(logdir, step, latest):
    """The checkpoints in logdir after global step `step`, oldest first;
    latest among them."""
    state = tf.train.get_checkpoint_state(logdir)
    paths = set(state.all_model_checkpoint_paths if state else []) | {latest}
    return sorted((p for p in paths if checkpoint_step(p) > step),
                  key=checkpoint_step)
