"""What a worker reports beyond the book's lines: where the model lives and
where it starts, its pace every few seconds, its totals and its gradients'
staleness at the end; and, with a --logdir, the chief's summaries and each
worker's staleness for TensorBoard."""

import time

import tensorflow.compat.v1 as tf

from ps_cluster import errors
from ps_cluster.deadlines import time_left
from ps_cluster.logdir import Logdir, close_within


class TrainingLog:
    """accuracy_on(split) is the model's accuracy on a split of `mnist`;
    staleness counts this worker's gradients (staleness.py),
    written as a histogram in staleness_dir, if any, at the end; placement
    is the lines of placement.py; the summaries go to the
    Supervisor's writer, the chief's. The chief's pace also says how far
    the run is, and how long it has left at that pace: the run ends at
    global step `last_step`, or, with `own_epochs` (the book's async
    workers), once the chief has made its `epochs` of steps_per_epoch
    steps, if that comes first (a resumed run's chief starts its epochs
    again, and stops at the first to begin past last_step)."""

    SUMMARY_EVERY_STEPS = 50
    PROGRESS_EVERY_SECS = 10

    def __init__(self, sv, sess, global_step, task_index, accuracy_on,
                 mnist, staleness, staleness_dir=None, placement=(),
                 epochs=None, steps_per_epoch=None, last_step=None,
                 own_epochs=False):
        self.epochs, self.steps_per_epoch = epochs, steps_per_epoch
        self.last_step, self.own_epochs = last_step, own_epochs
        self.epoch = self.first = None
        self.sv, self.sess, self.index = sv, sess, task_index
        self.accuracy_on, self.mnist = accuracy_on, mnist
        self.staleness, self.staleness_dir = staleness, staleness_dir
        # False once the writer's thread has failed, which it said: lost
        # summaries cost the summaries, not the run, and store nothing.
        self.writing = sv.summary_writer is not None
        self.started = self.last_progress = time.monotonic()
        self.local_step, self.last_global_step = 0, global_step
        # Named by task, not worker=: launch_local.sh keeps them in the logs,
        # off its terminal.
        for line in placement:
            print('/job:worker/task:%d: %s' % (task_index, line), flush=True)
        # For TensorBoard's text dashboard, a row a line.
        if self.writing and placement:
            self._write(global_step, [tf.Summary.Value(
                tag='placement', tensor=tf.make_tensor_proto(placement),
                metadata=tf.SummaryMetadata(plugin_data=(
                    tf.SummaryMetadata.PluginData(plugin_name='text'))))])
        print('worker=%d, starting at global_step=%d'
              % (task_index, global_step), flush=True)

    def step(self, global_step, local_step, loss, staleness):
        """After each session.run, however many steps it made, and the
        staleness of its gradients."""
        self.staleness.add(staleness, local_step - self.local_step)
        every = self.SUMMARY_EVERY_STEPS
        if self.writing and local_step // every > self.local_step // every:
            self._summary(global_step, loss=loss)
        self.local_step = local_step
        now = time.monotonic()
        where = self._where(global_step, now)
        if now - self.last_progress >= self.PROGRESS_EVERY_SECS or where:
            print('worker=%d, global_step=%d, local_step=%d, %.0f steps/s%s'
                  % (self.index, global_step, local_step,
                     local_step / (now - self.started), where), flush=True)
            # Where the Supervisor's own thread would write it.
            if self.writing:
                self._summary(global_step, **{'global_step/sec': (
                    global_step - self.last_global_step) / (
                        now - self.last_progress)})
            self.last_progress, self.last_global_step = now, global_step

    def _where(self, global_step, now):
        """The chief's ', epoch K of N, T left', from its pace, once a new
        epoch has begun or PROGRESS_EVERY_SECS have passed; else ''."""
        if self.index or not self.epochs:
            return ''
        # Its pace from its first run on: that one waits for the
        # connections to open.
        if self.first is None:
            self.first = now, global_step, self.local_step
            return ''
        secs = now - self.first[0]
        # Each end: (steps made, steps to make).
        ends = [(global_step - self.first[1], self.last_step - global_step)]
        if self.own_epochs:
            ends.append((self.local_step - self.first[2],
                         self.epochs * self.steps_per_epoch - self.local_step))
        done = max(global_step / self.last_step, self.own_epochs and (
            self.local_step / (self.epochs * self.steps_per_epoch)))
        epoch = min(self.epochs, int(done * self.epochs) + 1)
        lefts = [max(0, to_make) * secs / made for made, to_make in ends
                 if made > 0]
        # No pace yet: a sync worker's step may read the one before.
        if not lefts or epoch == self.epoch and (
                now - self.last_progress < self.PROGRESS_EVERY_SECS):
            return ''
        self.epoch = epoch
        return ', epoch %d of %d, %s' % (epoch, self.epochs,
                                         time_left(min(lefts)))

    def accuracies(self, global_step):
        """Beside the book's epoch line: the chief's validation and test
        accuracy, for TensorBoard."""
        if self.writing:
            self._summary(
                global_step,
                validation_accuracy=self.accuracy_on(self.mnist.validation),
                test_accuracy=self.accuracy_on(self.mnist.test))

    def final(self, global_step, accuracy):
        """How long and fast this worker trained, and how stale its
        gradients were, after its final test accuracy."""
        seconds = time.monotonic() - self.started
        print('worker=%d, local_steps=%d, global_step=%d, train_seconds=%.1f, '
              'steps_per_sec=%.1f' % (self.index, self.local_step, global_step,
                                      seconds, self.local_step / seconds),
              flush=True)
        print(self.staleness.line(self.index), flush=True)
        if self.staleness_dir:
            self._write_staleness(global_step)
        if self.writing:
            self._summary(global_step, test_accuracy=accuracy)

    def _write_staleness(self, global_step):
        """In a writer of its own: every worker has one, not only the
        chief; one that cannot write says so and ends as it would."""
        try:
            writer = tf.summary.FileWriter(self.staleness_dir)
            writer.add_summary(tf.Summary(value=[tf.Summary.Value(
                tag='staleness', histo=self.staleness.histogram())]),
                global_step)
            why = None if close_within(writer, Logdir.CLOSE_SECS) else (
                'not closed within %d s' % Logdir.CLOSE_SECS)
        except (tf.errors.OpError, OSError) as e:
            why = errors.what_went_wrong(e)
        if why:
            print('worker=%d: cannot write its staleness to %s: %s'
                  % (self.index, self.staleness_dir, why), flush=True)

    def _summary(self, global_step, **values):
        self._write(global_step, [tf.Summary.Value(tag=tag, simple_value=value)
                                  for tag, value in values.items()])

    def _write(self, global_step, values):
        try:
            self.sv.summary_computed(self.sess, tf.Summary(value=values),
                                     global_step=global_step)
        except RuntimeError:  # its writer's thread failed, and said so
            self.writing = False
