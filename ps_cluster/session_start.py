"""How a worker's training session is created: the chief joins the model
live on the ps tasks, restores it from the last checkpoint in --logdir, or
initializes it, and says which; the others wait for it."""

import tensorflow.compat.v1 as tf

from ps_cluster import errors, liveness, probes
from ps_cluster.exits import TaskFailed


class SessionCreator(tf.train.SessionCreator):
    """The Supervisor's session, once the ps tasks are up (within
    `timeout`), and a Watchdog (`watchdog`, its failures going to `stall`)
    beating for this worker from before it waits for the model; created at
    start-up, and again after a lost ps came back."""

    def __init__(self, sv, server, config, place, logdir, timeout, stall,
                 tokens=None):
        self.sv, self.server, self.config, self.place = (sv, server, config,
                                                         place)
        self.logdir, self.timeout = logdir, timeout
        self.stall, self.tokens = stall, tokens
        self.watchdog, self.created = None, 0

    def create_session(self):
        cluster = self.place.cluster
        if not self.created:  # later, a lost ps answered already
            probes.wait_for_tasks(cluster, 'ps', self.timeout)
        try:
            self.watchdog = liveness.Watchdog(
                self.sv, self.server, self.config, self.place, self.timeout,
                self.stall, self.tokens)
            sess = open_session(self.sv, self.server.target, self.config,
                                cluster, self.logdir, self.timeout,
                                reopened=self.created > 0)
        except tf.errors.InvalidArgumentError as e:
            raise errors.misplaced(cluster, e)
        self.created += 1
        return sess


def open_session(sv, target, config, cluster, logdir, timeout,
                 reopened=False):
    """The Supervisor's session, within timeout, or TaskFailed saying why
    not. The chief joins the model if the ps tasks hold it (a ps that never
    left, while the chief was away): newer than any checkpoint, and what
    Supervisor would otherwise initialize again under the workers."""
    if sv.is_chief and model_is_live(sv, target, config):
        sess = sv.session_manager.prepare_session(target, config=config)
        sv.start_standard_services(sess)
        print('worker=0: joined the live model on the ps at global_step=%d'
              % sess.run(sv.global_step), flush=True)
        return sess
    checkpoint = sv.is_chief and logdir and tf.train.latest_checkpoint(logdir)
    try:
        sess = sv.prepare_or_wait_for_session(target, config=config,
                                              max_wait_secs=timeout)
    except tf.errors.DeadlineExceededError:
        raise TaskFailed('the chief, /job:worker/task:0 (%s), did not '
                         'initialize the model within %g s'
                         % (cluster.task_address('worker', 0), timeout))
    except (tf.errors.DataLossError, tf.errors.InvalidArgumentError,
            tf.errors.NotFoundError) as e:
        if not checkpoint:
            raise
        raise TaskFailed('cannot restore the checkpoint %s (%s): move it '
                         'away, or choose another --logdir'
                         % (checkpoint, errors.what_went_wrong(e)))
    if checkpoint:
        # The model and the global step carry over to a cluster of any
        # shape; what is per worker or per ps (sync's local steps and token
        # queue, the liveness counters) is made anew, not restored.
        step = tf.train.load_variable(checkpoint, 'global_step')
        print('worker=0: restored the model from %s at global_step=%d, on %d '
              'ps and %d workers' % (checkpoint, step, cluster.num_tasks('ps'),
                                     cluster.num_tasks('worker')), flush=True)
    elif sv.is_chief and reopened:
        print('worker=0: initialized the model again: %s' % (
            'no checkpoint in --logdir yet' if logdir
            else 'without --logdir there is no checkpoint to restore'),
            flush=True)
    elif sv.is_chief:
        print('worker=0: initialized the model', flush=True)
    return sess


def model_is_live(sv, target, config):
    """Whether the ps tasks hold every shared variable initialized already:
    Supervisor's ready_op names the uninitialized ones, and local ones."""
    with tf.Session(target, config=config) as probe:
        uninitialized = {name.decode() for name in probe.run(sv.ready_op)}
    shared = sv.ready_op.graph.get_collection(tf.GraphKeys.GLOBAL_VARIABLES)
    return not uninitialized & {v.op.name for v in shared}
