"""TensorFlow 2's coordinator's lines of how long and fast it trains, and
its summaries for TensorBoard."""

import time

import tensorflow as tf

from ps_cluster.deadlines import time_left
from ps_cluster.logdir import Logdir


class Log:
    """The coordinator's lines of how long and fast it trained, and its
    summaries of loss and accuracy in logdir, for TensorBoard: a write
    there that fails (a full disk) is one line, and ends the summaries, not
    the run, as the TF1 scripts' do. `name` is the coordinator's, in its
    lines."""

    def __init__(self, task_index, start, logdir, name, epochs=None,
                 steps_per_epoch=None):
        self.index, self.start = task_index, start
        self.epochs, self.steps_per_epoch = epochs, steps_per_epoch
        self.started = time.monotonic()
        self.failed = Logdir(logdir, name).failed
        self.writer = logdir and self._write(
            lambda: tf.summary.create_file_writer(logdir))

    def epoch(self, step, **values):
        """After an epoch, at global step `step`: how far the run is, and
        how long it has left at its pace; the summaries of values."""
        last = self.epochs and self.epochs * self.steps_per_epoch
        pace = (step - self.start) / (time.monotonic() - self.started)
        if last and step < last and pace > 0:
            print('worker=%d, global_step=%d, %.0f steps/s, epoch %d of %d, '
                  '%s' % (self.index, step, pace, step // self.steps_per_epoch
                          + 1, self.epochs, time_left((last - step) / pace)),
                  flush=True)
        self._summaries(step, **values)

    def _summaries(self, step, **values):
        # The TF1 scripts' simple values, which TensorBoard reads without
        # its own package in this process.
        summary = tf.compat.v1.Summary(value=[
            tf.compat.v1.Summary.Value(tag=tag, simple_value=value)
            for tag, value in values.items()])

        def write():
            with self.writer.as_default():
                tf.summary.experimental.write_raw_pb(
                    summary.SerializeToString(), step=step)
            # A full disk fails here, once a write needs a new block.
            self.writer.flush()
        if self.writer:
            self._write(write)

    def final(self, step, accuracy):
        seconds = time.monotonic() - self.started
        print('worker=%d, local_steps=%d, global_step=%d, train_seconds=%.1f, '
              'steps_per_sec=%.1f' % (self.index, step - self.start, step,
                                      seconds, (step - self.start) / seconds),
              flush=True)
        self._summaries(step, test_accuracy=accuracy)
        if self.writer:
            self._write(self.writer.close)

    def _write(self, write):
        """write()'s value, or None once it failed: said in one line, and
        the summaries end."""
        try:
            return write()
        except (tf.errors.OpError, OSError) as e:
            self.failed('write summaries', e)
            self.writer = None
            return None
