"""How a worker's training session is created, as TensorFlow's
_CoordinatedSessionCreator creates one: the chief joins the model live on
the ps tasks, restores it from the last checkpoint in --logdir, or
initializes it, and says which; the others wait for it. Each session comes
with its Watchdog, its hooks run, and raises what any thread of the worker
stored in the Supervisor's coordinator (CoordinatedSession)."""

import tensorflow.compat.v1 as tf

from ps_cluster import errors, liveness, probes
from ps_cluster.deadlines import Deadline, call_within, poll
from ps_cluster.exits import TaskFailed


class SessionCreator(tf.train.SessionCreator):
    """Creates the Supervisor's session, once the ps tasks answer (within
    startup_timeout; after a lost ps, stored in sv.coord, within
    ps_timeout), with a Watchdog beating for this worker (`place`) from
    before it waits for the model, and each of `hooks` told of it. The
    main thread's calls into TensorFlow are told to `watch` (a StallWatch).
    The chief (`logdir`, a Logdir) saves a last checkpoint as it closes.
    """

    # How long the Supervisor's threads may take to stop after a lost ps:
    # one may wait on a ps that froze as it left.
    STOP_SECS = 10
    # How long closing a preemption's session, and telling the ps tasks,
    # may each take of the grace.
    TELL_SECS = 3

    def __init__(self, sv, server, config, place, hooks, watch,
                 startup_timeout, ps_timeout, logdir=None, tokens=None):
        self.sv, self.server, self.config, self.place = (sv, server, config,
                                                         place)
        self.hooks, self.watch, self.logdir, self.tokens = (hooks, watch,
                                                            logdir, tokens)
        self.startup_timeout, self.ps_timeout = startup_timeout, ps_timeout
        self.session = None  # the last one created

    def create_session(self):
        lost = errors.stored(self.sv.coord)
        if self.session is None:
            try:
                return self._create()
            except errors.LOST as e:
                raise TaskFailed(self._lost(e))
        if not errors.is_lost(lost):
            raise lost
        preempted = isinstance(lost, liveness.Preempted)
        print('worker=%d: %s; waiting up to %g s for it' % (
            self.place.index, lost.message if preempted else self._lost(lost),
            self.ps_timeout), flush=True)
        deadline = Deadline(self.ps_timeout, '--ps_timeout')
        # The workers hold their updates, the chief saves, then the ps goes.
        if preempted and self.sv.is_chief:
            print('worker=0: %s' % self.preempted(hold=True), flush=True)

        def created():
            nonlocal lost
            if probes.silent(self.place.cluster, 'ps') or (
                    preempted and liveness.preempted(self.place.cluster)):
                return None
            # Once the ps answers: closing a session waits on a ps gone.
            self._stop_threads()
            try:
                return [self._create()]
            except (tf.errors.OpError, RuntimeError) as e:
                # A run the stall watch cancelled raises what is stored.
                lost = errors.stored(self.sv.coord) or e
                if not errors.is_lost(lost):
                    raise lost
                self.sv.coord.request_stop(e)
                return None
        session = poll(created, deadline.left(), 0.5)
        if not session:
            raise TaskFailed('%s, which did not come back %s'
                             % (self._lost(lost), deadline))
        return session[0]

    def _create(self):
        """A session, its Watchdog and its hooks, within startup_timeout."""
        deadline = Deadline(self.startup_timeout, '--startup_timeout')
        reopened, sv, watch = self.session is not None, self.sv, self.watch
        if not reopened:
            probes.wait_for_tasks(self.place.cluster, 'ps', deadline)
        # The others beat before they wait for the chief's model.
        watchdog = None if sv.is_chief else self._watchdog(deadline)
        try:
            session = open_session(sv, self.server.target, self.config,
                                   self.place.cluster, watch, deadline,
                                   self.logdir and self.logdir.path, reopened,
                                   watchdog and watchdog.chief_left)
        except tf.errors.InvalidArgumentError as e:
            raise errors.misplaced(self.place.cluster, e)
        watchdog = watchdog or self._watchdog(deadline)
        watchdog.watch_training(session)
        self.session = session
        if reopened:
            with watch.calling('reading the global step', session):
                step = session.run(sv.global_step)
            print('worker=%d: resuming at global_step=%d'
                  % (self.place.index, step), flush=True)
        for hook in self.hooks:
            hook.after_create_session(session, sv.coord)
        return CoordinatedSession(session, sv, watch, watchdog, self.hooks,
                                  self.logdir)

    def preempted(self, hold=False):
        """The chief's save when a scheduler preempts it or a ps (SIGTERM),
        in a session of its own: the model as it stands; with `hold`, once
        the workers hold their updates (the global step stands still over
        a beat). Each ps that says it was preempted is told what became of
        it; returns that."""
        word, sess, steps = 'has no --logdir to save the model in', None, []

        def held():
            steps.append(sess.run(self.sv.global_step,
                                  options=liveness.Watchdog.RUN_OPTIONS))
            return steps[-2:] == steps[-1:] * 2
        if self.logdir:
            sess = tf.Session(self.server.target,
                              graph=self.sv.global_step.graph,
                              config=self.config)
            try:
                if hold:
                    poll(held, 5, liveness.Watchdog.POLL_SECS + 0.1)
                word = ('saved the model at global_step=%d'
                        % self.logdir.save(self.sv, sess))
            except (tf.errors.OpError, ValueError) as e:
                word = ('cannot save the model in --logdir=%s (%s): its '
                        'updates since the last checkpoint are lost' % (
                            self.logdir.path, errors.what_went_wrong(e)))
        # Each within a deadline, to leave the grace to the save: `with`
        # waits 30 s for a close after an error, and a ps that leaves once
        # told can hold up the close of the session that told it.
        for call, args in ((sess and sess.close, ()), (
                liveness.say_saved, (self.place.cluster, word))):
            try:
                if call:
                    call_within(self.TELL_SECS, call, *args)
            except (TimeoutError, tf.errors.OpError):
                pass
        return word

    def _watchdog(self, deadline):
        return liveness.Watchdog(self.sv, self.server, self.config,
                                 self.place, self.watch, deadline,
                                 self.tokens)

    def _stop_threads(self):
        """Stops the Supervisor's threads, the Watchdog among them, with the
        lost ps's error stored, closes the session they ran in, and clears
        the coordinator for the next session's."""
        try:
            call_within(self.STOP_SECS, self.session.close)
        except (TimeoutError, tf.errors.OpError, RuntimeError):
            pass
        try:
            self.sv.coord.join(stop_grace_period_secs=self.STOP_SECS,
                               ignore_live_threads=True)
        except Exception as e:  # the lost ps's error: the first stored
            if not errors.is_lost(e):
                raise
        self.sv.coord.clear_stop()

    def _lost(self, error):
        return errors.lost_connection(
            self.place.cluster, error, ('worker', self.place.index),
            probes.silent(self.place.cluster, 'ps'))


class CoordinatedSession:
    """A session of the Supervisor's, as TensorFlow's _CoordinatedSession
    and _HookedSession wrap one: run() raises the failure that any thread
    of this worker stored in sv.coord, a lost ps's among them, and calls
    each hook's after_run(); its Watchdog beats for this worker."""

    def __init__(self, session, sv, watch, watchdog, hooks, logdir):
        self.session, self.sv, self.watch = session, sv, watch
        self.watchdog, self.hooks, self.logdir = watchdog, hooks, logdir

    def run(self, fetches, feed_dict=None):
        self._raise_stored()
        try:
            with self.watch.calling('a training run', self.session):
                values = self.session.run(fetches, feed_dict)
                context = tf.train.SessionRunContext((fetches, feed_dict),
                                                     self.session)
                for hook in self.hooks:
                    hook.after_run(context, None)
        except (tf.errors.OpError, RuntimeError) as e:
            # Closing the session for a failure stored cancels the run.
            self._raise_stored()
            if errors.is_lost(e):
                self.sv.coord.request_stop(e)
            raise
        return values

    def wait_for_the_others(self):
        """Until every other worker has ended or is gone: the model then
        holds the run's last step."""
        self.watchdog.wait_for_the_others()

    def close(self):
        """Ends this worker's session: the chief's last checkpoint, once
        the others are done; the Supervisor's threads and the stall watch
        stopped; then this worker marked done, unless a failure is stored,
        which is raised. Closing the session cancels what the threads wait
        in (the sync chief's wait for gradients that will not come)."""
        if self.logdir:
            self.wait_for_the_others()
            with self.watch.calling('the last checkpoint', self.session):
                step = self.logdir.save_checkpoint(self.sv, self.session)
            if step is not None:
                self.logdir.say_done(step)
        self._raise_stored()
        self.sv.request_stop()
        with self.watch.calling('closing the session'):
            self.session.close()
        self.sv.stop(close_summary_writer=False)
        if self.sv.summary_writer:
            self.logdir.close_summaries(self.sv.summary_writer)
        self.watch.close()
        self.watchdog.mark_done()

    def _raise_stored(self):
        failure = errors.stored(self.sv.coord)
        if failure is not None:
            raise failure


def open_session(sv, target, config, cluster, watch, deadline, logdir,
                 reopened=False, chief_left=None):
    """The Supervisor's session, or TaskFailed saying why not, within the
    deadline. The chief joins the model if the ps tasks hold it (a ps
    that never left, while the chief was away): newer than any checkpoint,
    and what Supervisor would otherwise initialize again under the workers.
    The others wait for the model, and raise a failure a thread stores
    meanwhile, or the chief's reason once chief_left() says it left."""
    if not sv.is_chief:
        return _wait_for_the_model(sv, target, config, cluster, watch,
                                   deadline, chief_left)
    with watch.calling('opening a session', deadline=deadline):
        if model_is_live(sv, target, config):
            sess = sv.session_manager.prepare_session(target, config=config)
            sv.start_standard_services(sess)
            print('worker=0: joined the live model on the ps at '
                  'global_step=%d' % sess.run(sv.global_step), flush=True)
            return sess
        checkpoint = logdir and tf.train.latest_checkpoint(logdir)
        try:
            sess = sv.prepare_or_wait_for_session(target, config=config)
        except (tf.errors.DataLossError, tf.errors.InvalidArgumentError,
                tf.errors.NotFoundError) as e:
            if not checkpoint:
                raise
            raise TaskFailed('cannot restore the checkpoint %s (%s): move '
                             'it away, or choose another --logdir'
                             % (checkpoint, errors.what_went_wrong(e)))
    if checkpoint:
        # The model and the global step carry over to a cluster of any
        # shape; what is per worker or per ps (sync's local steps and token
        # queue, the liveness counters) is made anew, not restored.
        step = tf.train.load_variable(checkpoint, 'global_step')
        print('worker=0: restored the model from %s at global_step=%d, on %d '
              'ps and %d workers' % (checkpoint, step, cluster.num_tasks('ps'),
                                     cluster.num_tasks('worker')), flush=True)
    elif reopened:
        print('worker=0: initialized the model again: %s' % (
            'no checkpoint in --logdir yet' if logdir
            else 'without --logdir there is no checkpoint to restore'),
            flush=True)
    else:
        print('worker=0: initialized the model', flush=True)
    return sess


def _wait_for_the_model(sv, target, config, cluster, watch, deadline,
                        chief_left):
    """A worker's session once the chief has made the model ready,
    checking every second; the Supervisor's own wait could not be left for
    a failure stored."""
    chief = '/job:worker/task:0 (%s)' % cluster.task_address('worker', 0)
    while True:
        try:
            with watch.calling('the wait for the model',
                               deadline=deadline):
                sess = sv.session_manager.wait_for_session(
                    target, config=config, max_wait_secs=0)
            sv.start_queue_runners(sess)
            return sess
        except tf.errors.DeadlineExceededError:
            if not deadline.left():
                raise TaskFailed('the chief, %s, did not initialize the '
                                 'model %s' % (chief, deadline))
        reason = chief_left and chief_left()
        if reason is not None:
            raise TaskFailed('the chief, %s, went away before the model was '
                             'ready: "%s"' % (chief, reason))
        if sv.coord.wait_for_stop(1):
            raise errors.stored(sv.coord)


def model_is_live(sv, target, config):
    """Whether the ps tasks hold every shared variable initialized already:
    Supervisor's ready_op names the uninitialized ones, and local ones."""
    with tf.Session(target, config=config) as probe:
        uninitialized = {name.decode() for name in probe.run(sv.ready_op)}
    shared = sv.ready_op.graph.get_collection(tf.GraphKeys.GLOBAL_VARIABLES)
    return not uninitialized & {v.op.name for v in shared}
