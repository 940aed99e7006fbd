"""The chief's --logdir: checked before it joins the cluster, and a write
that fails there later (a full or broken file system) costs the chief its
checkpoints or summaries, with one line, not its run."""

import contextlib
import os
import socket
import sys
import threading

import tensorflow.compat.v1 as tf

from ps_cluster import errors
from ps_cluster.deadlines import call_within
from ps_cluster.exits import TaskFailed
from ps_cluster.settings import LOGDIR


# Why the chief left on purpose, and the step of its last checkpoint once it
# ended its run: for an evaluator that follows the logdir.
CHIEF_LEFT, CHIEF_DONE = 'chief_left', 'chief_done'


def checkpoint_step(path):
    """The global step in a checkpoint's name: Saver names it
    model.ckpt-STEP."""
    return int(path.rpartition('-')[2])


def marker(path, name, since):
    """What the chief wrote in the marker `name` of the logdir at path, if
    it did after `since` (a time): why it left on purpose (CHIEF_LEFT), the
    global step of its last checkpoint (CHIEF_DONE); else None."""
    marker = os.path.join(path, name)
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
    try:
        call_within(secs, writer.close)
    except TimeoutError:
        return False
    except RuntimeError:  # its thread failed, and said so
        pass
    return True


class Logdir:
    """Where the chief writes checkpoints, every save_checkpoint_secs, and
    summaries, and what a failed write there says; task_name names the
    chief in its lines."""

    # How long closing the summaries may take: TensorFlow's flush can wait
    # for good (close_within()).
    CLOSE_SECS = 10
    # How long a save waits for the one before it to end.
    LOCK_SECS = 5

    def __init__(self, path, task_name, save_checkpoint_secs=None):
        self.path, self.task_name = path, task_name
        self.save_checkpoint_secs = save_checkpoint_secs
        # The checkpoint loop's saves, and the chief's last.
        self._saving = threading.Lock()
        self._graph_written = False

    def check(self):
        """It must be a directory, or be creatable, and take a file; else
        TaskFailed, a usage error (status 2), says why."""
        # A probe of its own: the chief and an evaluator check at once.
        probe = os.path.join(self.path, '.writable-%s-%d' % (
            socket.gethostname(), os.getpid()))
        try:
            tf.io.gfile.makedirs(self.path)
            with tf.io.gfile.GFile(probe, 'w') as f:
                f.write('')
            tf.io.gfile.remove(probe)
        except tf.errors.OpError as e:
            raise TaskFailed('%s=%s: cannot write there (%s)'
                             % (LOGDIR, self.path, errors.what_went_wrong(e)),
                             status=2)

    def forget_ended(self):
        """A chief that starts again removes how an earlier one ended."""
        for name in (CHIEF_LEFT, CHIEF_DONE):
            marker = os.path.join(self.path, name)
            if tf.io.gfile.exists(marker):
                tf.io.gfile.remove(marker)

    def say(self, name, text):
        """Writes text into the marker `name` whole, or not at all, where an
        evaluator looks: why the chief leaves on purpose (CHIEF_LEFT), if
        need be in a logdir not made yet (it failed before); the step of
        its last checkpoint as it ends its run (CHIEF_DONE), the
        evaluator's last, however far the run got. A logdir that cannot
        take it is one the evaluator cannot use either."""
        with contextlib.suppress(OSError):
            os.makedirs(self.path, exist_ok=True)
            marker = os.path.join(self.path, name)
            with open(marker + '.new', 'w') as f:
                f.write(text)
            os.replace(marker + '.new', marker)

    def write_graph(self, sv):
        """The Supervisor's graph, as it writes it for TensorBoard and for a
        reader of where each variable lies, once: graph.pbtxt, and in the
        summaries, whose writer says itself if it fails. A graph.pbtxt
        that cannot be written is one line."""
        if self._graph_written:
            return
        self._graph_written = True
        graph = sv.global_step.graph
        try:
            tf.io.write_graph(graph.as_graph_def(add_shapes=True), self.path,
                              'graph.pbtxt')
        except (tf.errors.OpError, OSError) as e:
            self.failed('write the graph', e)
        if sv.summary_writer:
            sv.summary_writer.add_graph(graph)

    def save(self, sv, sess, calling=contextlib.nullcontext):
        """The chief's checkpoint, and its global step, saved in the call
        into TensorFlow that calling() marks; ValueError if the logdir is
        no folder any more, or the save before has not ended within
        LOCK_SECS: a save of a session closed after a lost ps may wait on
        the ps for good, and two saves through one Saver mix up its list
        of checkpoints."""
        with self.one_save(), calling():
            return checkpoint_step(sv.saver.save(
                sess, sv.save_path, global_step=sv.global_step))

    @contextlib.contextmanager
    def one_save(self, blocking=False):
        """One save at a time, of TensorFlow 1's chief or 2's coordinator
        (a save from the signals' thread beside the checkpoint loop's);
        ValueError if the one before has not ended within LOCK_SECS, unless
        `blocking`: however long it takes."""
        if not self._saving.acquire(timeout=-1 if blocking
                                    else self.LOCK_SECS):
            raise ValueError('the save before it has not ended within %g s'
                             % self.LOCK_SECS)
        try:
            yield
        finally:
            self._saving.release()

    def save_checkpoint(self, sv, sess, calling=contextlib.nullcontext):
        """save(), but one that fails is one line, and training goes on:
        None. Nothing is stored: a checkpoint lost costs that checkpoint,
        not the run."""
        try:
            return self.save(sv, sess, calling)
        except (tf.errors.OpError, ValueError) as e:
            # ValueError: the logdir is no folder any more; a lost ps the
            # main thread waits for; a session closed on a failure.
            if not (errors.is_lost(e) or isinstance(
                    e, tf.errors.CancelledError)):
                self.failed('save a checkpoint', e)
            return None

    def close_summaries(self, writer):
        """Closes the summary writer, or gives up on it after CLOSE_SECS
        with one line."""
        if not close_within(writer, self.CLOSE_SECS):
            print('%s: error: cannot close the summaries in %s=%s '
                  'within %d s; leaving them' % (
                      self.task_name, LOGDIR, self.path, self.CLOSE_SECS),
                  file=sys.stderr, flush=True)

    def failed(self, what, error):
        print('%s: error: cannot %s in %s=%s (%s); training goes on'
              % (self.task_name, what, LOGDIR, self.path,
                 errors.what_went_wrong(error)), file=sys.stderr, flush=True)
