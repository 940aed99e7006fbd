"""The chief's --logdir: checked before it joins the cluster, and a write
that fails there later (a full or broken file system) costs the chief its
checkpoints or summaries, with one line, not its run."""

import os
import socket
import sys
import threading

import tensorflow.compat.v1 as tf

from ps_cluster import errors


# Why the chief left on purpose, for an evaluator that follows the logdir.
CHIEF_LEFT = 'chief_left'


def chief_left(path, since):
    """Why the chief left on purpose, if it did after `since` (a time), as
    it wrote in the logdir at path; else None."""
    marker = os.path.join(path, CHIEF_LEFT)
    try:
        if os.path.getmtime(marker) < since:
            return None
        with open(marker) as f:
            return f.read()
    except OSError:
        return None


def close_within(writer, secs):
    """Closes a summary writer and says True, or gives up on it after secs:
    TensorFlow's flush waits for good if its writer thread dies between
    marking the last flush done and closing its queue
    (event_file_writer.py)."""
    def close():
        try:
            writer.close()
        except RuntimeError:  # its thread failed, and said so
            pass
    closing = threading.Thread(target=close, daemon=True)
    closing.start()
    closing.join(secs)
    return not closing.is_alive()


class Logdir:
    """Where the chief writes checkpoints, every save_checkpoint_secs, and
    summaries, and what a failed write there says; task_name names the
    chief in its lines."""

    CLOSE_SECS = 10

    def __init__(self, path, task_name, save_checkpoint_secs=None):
        self.path, self.task_name = path, task_name
        self.save_checkpoint_secs = save_checkpoint_secs

    def check(self):
        """It must be a directory, or be creatable, and take a file; else
        ValueError says why."""
        # A probe of its own: the chief and an evaluator check at once.
        probe = os.path.join(self.path, '.writable-%s-%d' % (
            socket.gethostname(), os.getpid()))
        try:
            tf.io.gfile.makedirs(self.path)
            with tf.io.gfile.GFile(probe, 'w') as f:
                f.write('')
            tf.io.gfile.remove(probe)
        except tf.errors.OpError as e:
            raise ValueError('--logdir=%s: cannot write there (%s)'
                             % (self.path, errors.what_went_wrong(e)))

    def forget_left(self):
        """A chief that starts again removes why an earlier one left."""
        marker = os.path.join(self.path, CHIEF_LEFT)
        if tf.io.gfile.exists(marker):
            tf.io.gfile.remove(marker)

    def say_left(self, reason):
        """Writes why the chief leaves on purpose, where an evaluator looks,
        if need be in a logdir not made yet (it failed before); a logdir
        that cannot take it is one the evaluator cannot use either."""
        try:
            os.makedirs(self.path, exist_ok=True)
            with open(os.path.join(self.path, CHIEF_LEFT), 'w') as f:
                f.write(reason)
        except OSError:
            pass

    def save_checkpoint(self, sv, sess):
        """The chief's checkpoint; one that fails is one line, and training
        goes on."""
        try:
            sv.saver.save(sess, sv.save_path, global_step=sv.global_step)
        except (tf.errors.OpError, ValueError) as e:
            # ValueError: the logdir is no folder any more; a lost ps the
            # main thread waits for.
            if not errors.is_lost(e):
                self.failed('save a checkpoint', e)

    def close_summaries(self, writer):
        """Closes the summary writer, or gives up on it after CLOSE_SECS
        with one line."""
        if not close_within(writer, self.CLOSE_SECS):
            print('%s: error: cannot close the summaries in --logdir=%s '
                  'within %d s; leaving them' % (
                      self.task_name, self.path, self.CLOSE_SECS),
                  file=sys.stderr, flush=True)

    def failed(self, what, error):
        print('%s: error: cannot %s in --logdir=%s (%s); training goes on'
              % (self.task_name, what, self.path,
                 errors.what_went_wrong(error)), file=sys.stderr, flush=True)

    @staticmethod
    def is_summary_writer(thread):
        """Whether thread is TensorFlow's that writes the summaries: it ends
        at the first write that fails, and TrainingLog writes no more."""
        return type(thread).__name__ == '_EventLoggerThread'
