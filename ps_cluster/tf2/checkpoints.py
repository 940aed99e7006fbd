"""TensorFlow 2's coordinator's checkpoints in logdir/tf2, from which a run
goes on, and the variables as last read, which a save that cannot read
them saves."""

import contextlib
import os
import threading

import tensorflow as tf

from ps_cluster import errors
from ps_cluster.deadlines import call_within
from ps_cluster.logdir import Logdir
from ps_cluster.settings import LOGDIR


class Checkpoints:
    """The coordinator's checkpoints in logdir/tf2 (tf.train.Checkpoint and
    CheckpointManager), the variables restored from the last one, or from
    a TF1 run's in logdir; `source` says which, if any; `name` is the
    coordinator's, in its lines."""

    def __init__(self, logdir, variables, name):
        self.source = 'new variables'
        self.manager = self.last = self.values = None
        # The values last read, which the join's reads write too.
        self._kept = threading.Lock()
        self.logdir, self.variables = logdir, variables
        # One save at a time, of the shared copies: the epoch's, and a
        # preemption's from another thread (Logdir.one_save()); a write
        # that fails, in one line (Logdir.failed()).
        self._dir = Logdir(logdir, name)
        self.failed = self._dir.failed
        if not logdir:
            return
        checkpoint = tf.train.Checkpoint(**variables)
        # Saved from copies on the coordinator: TensorFlow saves variables
        # of several tasks in a tf.function traced anew each time, and its
        # registration on every task holds the GIL, for good on a frozen ps.
        # Named as the variables: an evaluator's TF1 Saver reads by name.
        self.copies = {name: tf.Variable(tf.zeros(v.shape, v.dtype),
                                         name=name)
                       for name, v in variables.items()}
        self.manager = tf.train.CheckpointManager(
            tf.train.Checkpoint(**self.copies), os.path.join(logdir, 'tf2'),
            max_to_keep=5)
        tf1 = tf.train.latest_checkpoint(logdir)
        if self.manager.latest_checkpoint:
            latest = self.manager.latest_checkpoint
            checkpoint.restore(latest).assert_consumed()
            self.source = 'the checkpoint %s' % latest
        elif tf1:
            # Not tf.train.Checkpoint's name-based restore: it matches a
            # variable by its name in the graph, and a split w's shards are
            # w/part_0, ... there but one tensor w in a TF1 checkpoint.
            reader = tf.train.load_checkpoint(tf1)
            for name, variable in variables.items():
                variable.assign(reader.get_tensor(name))
            self.source = 'the TF1 checkpoint %s' % tf1
        # The model as this process starts it, kept as the first read: a
        # preemption's save that cannot read it before the join's first
        # read (a network cut as it starts) saves this, which the
        # checkpoint it came from holds already.
        if self.manager.latest_checkpoint:
            self.last = int(
                self.manager.latest_checkpoint.rpartition('-')[2])
        with contextlib.suppress(tf.errors.OpError):
            self.read()

    def read(self):
        """The variables as they stand, read once each, the global step
        first (the model holds at least its updates), and kept unless a
        read of a later step was kept meanwhile: a save that cannot read
        them (a ps behind a broken connection) saves those. Returns
        them."""
        values = {name: tf.convert_to_tensor(self.variables[name]).numpy()
                  for name in sorted(self.variables,
                                     key=lambda name: name != 'global_step')}
        with self._kept:
            if self.values is None or (values['global_step']
                                       >= self.values['global_step']):
                self.values = values
        return values

    def follow(self):
        """The global step as it stands, read alone; with a logdir, the
        variables too, kept (read()) for a save that cannot read them."""
        if self.manager:
            return int(self.read()['global_step'])
        return int(tf.convert_to_tensor(self.variables['global_step']).numpy())

    def save(self):
        """A checkpoint of the variables as they stand, named after the
        global step it holds, which it returns. One that cannot be written
        (a full disk) is one line, and training goes on: None; a ps that
        cannot be read raises."""
        if not self.manager:
            return None
        values = self.read()
        try:
            # After a preemption's save, however long it takes.
            with self._dir.one_save(blocking=True):
                return self._write(values)
        except (tf.errors.OpError, OSError) as e:
            self.failed('save a checkpoint', e)
            return None

    def save_now(self, read_secs):
        """A checkpoint for a preemption, from the signals' thread or as a
        ps is preempted: of the variables as they stand, or, if they cannot
        be read within read_secs, as they were last read (follow(), as
        Coordinator.join() waits); says what it saved."""
        if not self.manager:
            return 'has no %s to save the model in' % LOGDIR
        how = ''
        try:
            values = call_within(read_secs, self.read)
        except (TimeoutError, tf.errors.OpError) as e:
            with self._kept:
                values = self.values
            if values is None:
                return self._lost(errors.what_went_wrong(e))
            how = ' as last read (%s)' % errors.what_went_wrong(e)
        try:
            with self._dir.one_save():
                step = self._write(values)
        except ValueError as e:
            return self._lost(e)
        except (tf.errors.OpError, OSError) as e:
            return self._lost(errors.what_went_wrong(e))
        return 'saved the model at global_step=%d%s' % (step, how)

    def _lost(self, why):
        return ('cannot save the model in %s=%s (%s): its steps since the '
                'last checkpoint are lost' % (LOGDIR, self.logdir, why))

    def _write(self, values):
        """The checkpoint of values, through the copies, unless that step's
        is saved already; its step."""
        step = int(values['global_step'])
        if step != self.last:
            for name, copy in self.copies.items():
                copy.assign(values[name])
            self.manager.save(checkpoint_number=step)
            self.last = step
        return step
