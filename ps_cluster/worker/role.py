"""A worker's role: the scripts' calls that make its training session,
report its training, and export the model, and how it leaves."""

import collections
import itertools
import os

import numpy as np
import tensorflow.compat.v1 as tf

import mnist_data
from ps_cluster import exits, liveness, probes
from ps_cluster.deadlines import Outage, poll
from ps_cluster.exits import TaskFailed
from ps_cluster.logdir import CHIEF_DONE, CHIEF_LEFT, marker
from ps_cluster.task import Task
from ps_cluster.worker import placement
from ps_cluster.worker.recoverable_session import RecoverableSession
from ps_cluster.worker.session_start import SessionCreator
from ps_cluster.worker.staleness import Staleness
from ps_cluster.worker.stall_watch import StallWatch
from ps_cluster.worker.sync_tokens import SyncTokens
from ps_cluster.worker.training_log import TrainingLog


class Worker(Task):
    """A worker task (a Task): from its start-up checks on, one that ends
    on purpose tells the ps tasks why, and the others quote it instead of
    waiting for it; in an elastic run, SIGTERM on a worker but the chief
    is a scale-down: it leaves, and the others train on without it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # At start, a ps started beside it may not be up yet.
        self.end.before_leaving(
            lambda why: self.tell(why, self.end.LAST_WORDS_SECS - 1))
        if self.elastic and not self.is_chief:
            self.end.on_preemption(self.scaled_down,
                                   self.settings.preemption_grace)

    def scaled_down(self):
        """SIGTERM in an elastic run: this worker leaves, told to the ps
        tasks; returns its line."""
        self.tell('left on SIGTERM (a scale-down)',
                  exits.TaskEnd.LAST_WORDS_SECS)
        return 'left on SIGTERM; the others train on'

    def tell(self, reason, secs=0):
        """Says why this worker ends on purpose: on the ps tasks (secs: how
        long to try those not up yet), and the chief in its logdir too,
        for an evaluator."""
        if self.logdir:
            self.logdir.say(CHIEF_LEFT, reason)
        liveness.say_left(self.place.cluster, self.index, reason, secs,
                          self.slot)

    def sync_tokens(self, optimizer, chief_queue_runner, init_token_op,
                    global_step, last_step):
        """SyncTokens: the chief's queue runner and tokens in each new
        session, and the workers' tokens when a task is lost."""
        return SyncTokens(optimizer, chief_queue_runner, init_token_op,
                          self.is_chief, global_step, last_step,
                          len(self.cluster['worker']))

    def training_session(self, sv, worker_server, last_step, tokens=None):
        """sv.prepare_or_wait_for_session(server.target), once the ps tasks
        are up, in a session that outlives a lost ps (ps_cluster/README.md);
        sync's `tokens` start the chief's updates in each new session. In an
        elastic run, a worker other than the chief that comes once the run
        is over, its global step at last_step, says so and ends the task,
        status 0: as the chief's marker in logdir says, or the global step
        on the ps (without min_workers, it measures the model as any worker
        does at the end)."""
        settings = self.settings
        self.gpu.check(worker_server, self.config, 'worker', self.index)
        self._came_after_the_end(self._marked_end(),
                                 last_step)  # it may end the task
        # Its threads' failures raised in the main thread, which is ended
        # only if stuck in TensorFlow.
        # One clock for the wait for a lost ps, which the stall watch and
        # the session's recovery both read.
        outage = Outage(settings.ps_timeout)
        watch = StallWatch(self.end, self.place, settings.stall_timeout,
                           outage, self.elastic)
        watch.start()
        creator = SessionCreator(sv, worker_server, self.config, self.place,
                                 [tokens] if tokens else [], watch,
                                 settings.startup_timeout,
                                 settings.preemption_grace, self.logdir,
                                 tokens, self.slot)
        try:
            sess = RecoverableSession(creator, outage).open()
        except TaskFailed as e:
            # The ps tasks leave once the run has ended: an elastic run's,
            # once the chief and the workers that came have.
            self._came_after_the_end(self._marked_end(
                waited=isinstance(e, probes.NotUp)),
                last_step)  # it may end the task
            # A ps that never came up may have left with the run.
            if self.elastic and isinstance(e, probes.NotUp):
                raise TaskFailed('%s; the run may have ended before this '
                                 'worker came' % e.message)
            raise
        if self.elastic and not self.is_chief:
            self._came_after_the_end(sess.run(sv.global_step), last_step,
                                     sess)  # it may end the task
        # From now on a ps that does not answer is lost, not late: one try.
        self.end.before_leaving(self.tell)
        if self.is_chief:
            self.end.on_preemption(lambda: print(
                'worker=0: preempted: %s' % creator.preempted(), flush=True),
                settings.preemption_grace)
        return sess

    def _marked_end(self, waited=False):
        """The global step at which the chief ended its run, from its marker
        in logdir, for a worker of an elastic run other than the chief,
        once no ps task has come up for STARTUP_GRACE_SECS (or it `waited`
        for them already, in vain); else None. A run ends as its ps tasks
        leave: a marker beside a ps that listens is an earlier run's, which
        this run's chief has yet to remove (one slower to come up than that
        is taken for a run that ended)."""
        if not (self.elastic and not self.is_chief and self.settings.logdir):
            return None
        ps = self.place.cluster.job_tasks('ps')
        if poll(lambda: any(map(probes.is_listening, ps)),
                0 if waited else probes.STARTUP_GRACE_SECS, 0.2):
            return None
        return marker(self.settings.logdir, CHIEF_DONE, 0)

    def _came_after_the_end(self, step, last_step, sess=None):
        """If step, the run's, is at last_step: says so, closes sess (this
        worker marked done), and ends the task, status 0."""
        if step is not None and int(step) >= last_step:
            print('worker=%d: the run ended at global_step=%d, before this '
                  'worker came: nothing is left to train' % (self.index,
                                                             int(step)),
                  flush=True)
            if sess:
                sess.close()
            self.end.leave()

    def epochs(self, epochs):
        """The async workers' epochs: `epochs` each, or, in an elastic run,
        as many as it takes them to reach its last global step."""
        return itertools.count() if self.elastic else range(epochs)

    def training_log(self, sv, sess, global_step, mnist, accuracy_op, x_p,
                     y_p):
        """What this worker prints beyond the book's lines: first, where
        the model's variables live, which a chief with logdir writes for
        TensorBoard too; its gradients' staleness, which it writes in
        logdir/staleness; and the chief's summaries of accuracy_op on
        mnist's splits."""
        settings = self.settings

        def accuracy_on(split):
            split = mnist_data.as_float(split)
            return sess.run(accuracy_op, {x_p: split.images,
                                          y_p: split.labels})
        # Only the sync script's accumulators drop stale gradients.
        staleness = Staleness(drops_stale=self.sync)
        # TensorBoard shows each worker's histogram as a run of its own.
        staleness_dir = settings.logdir and os.path.join(
            settings.logdir, 'staleness', 'worker_%d' % self.index)
        where = placement.lines(
            tf.trainable_variables() + [tf.train.get_global_step()],
            self.place.tasks('ps'))
        # How far the run is: it ends at a global step, and the book's
        # async workers each after their own epochs.
        steps_per_epoch = len(mnist.train.images) // settings.batch_size
        last_step = settings.epochs * steps_per_epoch * (
            1 if self.sync else len(self.cluster['worker']))
        return TrainingLog(sv, sess, global_step, self.index, accuracy_on,
                           mnist, staleness, staleness_dir, where,
                           settings.epochs, steps_per_epoch, last_step,
                           own_epochs=not (self.sync or self.elastic))

    def export(self, sess, model, mnist):
        """With export_dir, the chief writes the model as a SavedModel for
        serving, once every other worker has ended, and says its test
        accuracy."""
        # Under srun every task has the same flags: one writer, the
        # evaluator.
        if (self.settings.export_dir and self.is_chief
                and not self.settings.slurm_evaluator):
            # Until every other worker has ended or is gone: the model then
            # holds the run's last step.
            sess.session.watchdog.wait_for_the_others()
            variables = (tf.trainable_variables()
                         + [tf.train.get_global_step()])
            # With split_w, w/part_0, w/part_1, ...: one w, as model()
            # makes.
            parts = collections.defaultdict(list)
            for variable, value in zip(variables, sess.run(variables)):
                parts[variable.op.name.split('/part_')[0]].append(value)
            values = {name: np.concatenate(part) if len(part) > 1 else part[0]
                      for name, part in parts.items()}
            self.export_model(model, values, values['global_step'], mnist)
