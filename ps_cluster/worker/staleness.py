"""How stale a worker's gradients are: how many updates reached the
variables between its read of them and the arrival of its gradients, and,
in sync, which gradients SyncReplicasOptimizer dropped for it."""

import collections

import tensorflow.compat.v1 as tf


def global_step_copy(global_step, after=None):
    """The global step, copied on its ps as a session.run starts there (as
    the worker reads w and b), or once `after` has run. A Snapshot: a read
    of a ref variable, and `+ 0`, which grappler makes an Identity, are
    aliases of it, whose value is taken only as it is sent."""
    with tf.device(global_step.device):
        with tf.control_dependencies([after] if after is not None else []):
            return tf.raw_ops.Snapshot(input=global_step)


def global_steps_around(global_step, update):
    """[the global step as a session.run starts, and once `update` has run],
    copied on its ps and fetched as one tensor: one transfer a step."""
    with tf.device(global_step.device):
        return tf.stack([global_step_copy(global_step),
                         global_step_copy(global_step, update)])


def local_step_copy():
    """SyncReplicasOptimizer's `sync_rep_local_step` of this worker, copied
    as a session.run starts: the global step its gradients are computed at,
    which its accumulators compare with their own."""
    local_step, = [v for v in tf.local_variables()
                   if v.op.name.endswith('sync_rep_local_step')]
    with tf.device(local_step.device):
        return tf.raw_ops.Snapshot(input=local_step)


class Staleness:
    """counts[s]: this worker's session.runs whose gradients came s updates
    after the variables they were computed from. A sync accumulator applies
    only those of staleness 0; async applies every gradient."""

    def __init__(self, drops_stale):
        self.drops_stale = drops_stale
        self.counts = collections.Counter()
        self.gradients = self.dropped = 0

    def add(self, staleness, gradients=1):
        """One session.run, which sent `gradients` of its own."""
        self.counts[staleness] += 1
        self.gradients += gradients
        if self.drops_stale and staleness > 0:
            self.dropped += gradients

    def line(self, task_index):
        return ('worker=%d, gradients=%d, applied=%d, dropped=%d, '
                'staleness mean=%.2f (%s)'
                % (task_index, self.gradients, self.gradients - self.dropped,
                   self.dropped, sum(s * n for s, n in self.counts.items())
                   / max(sum(self.counts.values()), 1),
                   ' '.join('%d:%d' % item
                            for item in sorted(self.counts.items()))))

    def histogram(self):
        """The counts as a TensorBoard histogram, one bucket per value."""
        values = sorted(self.counts)
        return tf.HistogramProto(
            min=values[0] if values else 0, max=values[-1] if values else 0,
            num=sum(self.counts.values()),
            sum=sum(s * n for s, n in self.counts.items()),
            sum_squares=sum(s * s * n for s, n in self.counts.items()),
            bucket_limit=[s + 0.5 for s in values],
            bucket=[self.counts[s] for s in values])
