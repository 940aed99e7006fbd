"""How a worker's training session is created, as TensorFlow's
_CoordinatedSessionCreator creates one: each with a Coordinator of its own,
which its threads stop on and store their failures in; the chief joins the
model live on the ps tasks, restores it from the last checkpoint in
--logdir, or initializes it, and says which; the others wait for it."""

import contextlib

import tensorflow.compat.v1 as tf

from ps_cluster import errors, liveness, probes
from ps_cluster.deadlines import Deadline, call_within, poll
from ps_cluster.exits import TaskFailed
from ps_cluster.logdir import CHIEF_DONE
from ps_cluster.settings import LOGDIR
from ps_cluster.worker.watchdog import Watchdog


class SessionCreator(tf.train.SessionCreator):
    """Creates the Supervisor's sessions, on this worker's `server` (at
    `place`), once the ps tasks answer, each with a Watchdog beating for
    this worker from before it waits for the model, and each of `hooks`
    told of it; `slot`, this worker's liveness.Slot. The main thread's
    calls into TensorFlow are told to `watch` (a StallWatch). The chief
    (`logdir`, a Logdir) saves checkpoints every save_checkpoint_secs, a
    last one as it closes, and, for a preemption, one within
    preemption_grace.

    None of the Supervisor's services run: its coordinator, one for its
    life, would have to be cleared for the next session, and a thread of
    the last one could then store its failure in the new one's."""

    # How long closing a preemption's session, and telling the ps tasks,
    # may each take of the grace.
    TELL_SECS = 3

    def __init__(self, sv, server, config, place, hooks, watch,
                 startup_timeout, preemption_grace, logdir=None,
                 tokens=None, slot=None):
        self.sv, self.server, self.config, self.place = (sv, server, config,
                                                         place)
        self.hooks, self.watch, self.logdir, self.tokens = (hooks, watch,
                                                            logdir, tokens)
        self.slot = slot
        self.startup_timeout = startup_timeout
        self.preemption_grace = preemption_grace
        self.session = None  # the last one created
        # Whether the chief saved for a preempted ps in this recovery.
        self.saved = False

    def create_session(self, deadline=None):
        """One attempt: a CoordinatedSession; or the error of a lost ps
        (errors.is_lost), a ps not answering or saying it was preempted
        among them; or TaskFailed. A recovery's asks whether the ps tasks
        are back within its `deadline` (a Deadline); once they are, as the
        first once they are up, it starts within startup_timeout."""
        start = Deadline(self.startup_timeout)
        coord = tf.train.Coordinator()
        self.watch.store_in(coord)
        if self.session is None:
            probes.wait_for_tasks(self.place.cluster, 'ps', start)
        else:
            with self.watch.calling("reading the ps tasks' farewells",
                                    deadline=deadline or start):
                silent = probes.silent(self.place.cluster, 'ps')
                farewells = ([] if silent
                             else liveness.farewells(self.place.cluster))
            # A ps preempted during a recovery (one from a network cut, say)
            # waits for the chief's save as one preempted at its start does.
            if (self.sv.is_chief and not self.saved
                    and liveness.PREEMPTED in farewells):
                self.saved = True
                print('worker=0: %s' % self.preempted(hold=True), flush=True)
            if silent or any(word.startswith(liveness.PREEMPTED)
                             for word in farewells):
                raise tf.errors.UnavailableError(None, None,
                                                 'a ps task is not back')
            # Once the ps answers: closing a session waits on a ps gone.
            self.session.abandon()
        made = []  # what this attempt closes, in order, if it fails
        try:
            self.session = self._create(coord, start, made)
        except BaseException:
            stop(coord, made)
            # A session the stall watch closed raises what it stored.
            coord.raise_requested_exception()
            raise
        return self.session

    def _create(self, coord, deadline, made):
        reopened, sv = self.session is not None, self.sv
        # The others beat before they wait for the chief's model.
        watchdog = None if sv.is_chief else self._watchdog(coord, deadline,
                                                           made)
        try:
            session = open_session(sv, self.server.target, self.config,
                                   self.place.cluster, self.watch, coord,
                                   deadline, self.logdir, reopened,
                                   watchdog and watchdog.chief_left)
        except tf.errors.InvalidArgumentError as e:
            raise errors.misplaced(self.place, e)
        made.insert(0, session.close)
        watchdog = watchdog or self._watchdog(coord, deadline, made)
        watchdog.sess = session
        if reopened:
            with self.watch.calling('reading the global step', session):
                step = session.run(sv.global_step)
            print('worker=%d: resuming at global_step=%d'
                  % (self.place.index, step), flush=True)
        for hook in self.hooks:
            with self.watch.calling('starting a hook', session):
                hook.after_create_session(session, coord)
        # In a thread of the session's that outlives a failed save: the
        # Supervisor's own would stop every thread of the chief.
        if self.logdir and self.logdir.save_checkpoint_secs:
            tf.train.LooperThread.loop(
                coord, self.logdir.save_checkpoint_secs,
                self.logdir.save_checkpoint, args=(sv, session))
        return CoordinatedSession(session, coord, sv, self.watch, watchdog,
                                  self.hooks, self.logdir)

    def recovering(self, error, deadline):
        """Says what this worker waits for after `error`, a lost ps's (until
        deadline, a Deadline), and the chief saves the model of a ps that
        was preempted, once the workers hold their updates; a ps preempted
        later in the recovery, once, as it is found (create_session())."""
        self.saved = False
        if isinstance(error, errors.Stuck):
            print('worker=%d: %s; trying a new session' % (
                self.place.index, error.message), flush=True)
            return
        preempted = isinstance(error, liveness.Preempted)
        print('worker=%d: %s; waiting up to %g s for it' % (
            self.place.index, error.message if preempted else self.lost(error),
            deadline.limit.secs), flush=True)
        if preempted and self.sv.is_chief:
            self.saved = True
            print('worker=0: %s' % self.preempted(hold=True), flush=True)

    def lost(self, error):
        """The line of a lost ps: which one, as the error names it, or as it
        does not answer."""
        return errors.lost_connection(
            self.place, error, probes.silent(self.place.cluster, 'ps'))

    def preempted(self, hold=False):
        """The chief's save when a scheduler preempts it or a ps (SIGTERM),
        in a session of its own, within preemption_grace: the model as it
        stands; with `hold`, once the workers hold their updates (the global
        step stands still over a beat). Each ps that says it was preempted
        is told what became of it; returns that."""
        deadline = Deadline(self.preemption_grace)
        word, sess = 'has no %s to save the model in' % LOGDIR, None
        if self.logdir:
            # Over connections of its own: after a network cut, even one
            # that healed, the shared ones may carry nothing for minutes.
            config = tf.ConfigProto()
            config.CopyFrom(self.config)
            config.rpc_options.disable_session_connection_sharing = True
            sess = tf.Session(self.server.target,
                              graph=self.sv.global_step.graph, config=config)
            try:
                # What is left but the time to close and tell: a new
                # session's first run waits for good for a ps gone.
                word = 'saved the model at global_step=%d' % call_within(
                    max(0, deadline.left() - 2 * self.TELL_SECS),
                    self._save, sess, hold and deadline.left() / 2)
            except (tf.errors.OpError, ValueError, TimeoutError) as e:
                word = ('cannot save the model in %s=%s (%s): its '
                        'updates since the last checkpoint are lost' % (
                            LOGDIR, self.logdir.path, 'no answer %s' % deadline
                            if isinstance(e, TimeoutError)
                            else errors.what_went_wrong(e)))
        # Each within TELL_SECS of what is left of the grace: a ps that
        # leaves once told can hold up the close of the session that told
        # it.
        for call in (sess and sess.close,
                     lambda: liveness.say_saved(self.place.cluster, word)):
            if call:
                with contextlib.suppress(TimeoutError, tf.errors.OpError):
                    call_within(min(self.TELL_SECS, deadline.left()), call)
        return word

    def _save(self, sess, hold_secs):
        """The model saved in sess, once the workers hold their updates, up
        to hold_secs (none: at once); its global step."""
        steps = []

        def held():
            steps.append(sess.run(self.sv.global_step,
                                  options=Watchdog.RUN_OPTIONS))
            return steps[-2:] == steps[-1:] * 2
        if hold_secs:
            poll(held, hold_secs, liveness.POLL_SECS + 0.1)
        return self.logdir.save(self.sv, sess)

    def _watchdog(self, coord, deadline, made):
        watchdog = Watchdog(coord, self.sv.global_step, self.server,
                                     self.config, self.place, self.watch,
                                     deadline, self.tokens, self.slot)
        made += [watchdog.join, watchdog.session.close]
        return watchdog


class CoordinatedSession:
    """A session of the Supervisor's and its Coordinator, as TensorFlow's
    _CoordinatedSession and _HookedSession wrap one: its threads (the
    Watchdog, the hooks') stop on `coord` and store their failures there;
    run() raises one, a lost ps's among them, and calls each hook's
    after_run()."""

    # How long its Watchdog may take to stop, and its sessions to close:
    # each may wait on a ps that froze as it left.
    STOP_SECS = 10

    def __init__(self, session, coord, sv, watch, watchdog, hooks, logdir):
        self.session, self.coord, self.sv = session, coord, sv
        self.watch, self.watchdog = watch, watchdog
        self.hooks, self.logdir = hooks, logdir
        # What abandon() has yet to stop and close.
        self.closes = [session.close, watchdog.join, watchdog.session.close]

    def run(self, fetches, feed_dict=None):
        self.coord.raise_requested_exception()
        try:
            with self.watch.calling('a training run', self.session,
                                    trains=True):
                values = self.session.run(fetches, feed_dict)
            context = tf.train.SessionRunContext((fetches, feed_dict),
                                                 self.session)
            for hook in self.hooks:
                with self.watch.calling('a hook after a run', self.session):
                    hook.after_run(context, None)
        except (tf.errors.OpError, RuntimeError) as e:
            # Closing the session for a failure stored cancels the run.
            self.coord.raise_requested_exception()
            if errors.is_lost(e):
                self.coord.request_stop(e)
            raise
        return values

    def close(self):
        """Ends this worker's session: the chief's last checkpoint, once
        the others are done; its threads stopped, and the stall watch; then
        this worker marked done, unless a failure is stored, which is
        raised. Closing the session cancels what the threads wait in (the
        sync chief's wait for gradients that will not come)."""
        if self.logdir:
            self.watchdog.wait_for_the_others()
            try:
                step = self.logdir.save_checkpoint(
                    self.sv, self.session,
                    lambda: self.watch.calling('the last checkpoint',
                                               self.session))
            finally:
                # A failure stored meanwhile closed the session it saved
                # in: that failure is the one to raise.
                self.coord.raise_requested_exception()
            if step is not None:
                self.logdir.say(CHIEF_DONE, str(step))
        self.coord.request_stop()
        with self.watch.calling('closing the session'):
            self.session.close()
        self.watchdog.join(self.STOP_SECS)
        # Not coord.join(): a thread that fails after it would raise in its
        # own thread. What is stored is raised before this worker is marked
        # done.
        self.coord.raise_requested_exception()
        if self.sv.summary_writer:
            self.logdir.close_summaries(self.sv.summary_writer)
        self.watch.close()
        self.watchdog.mark_done()
        self.watchdog.session.close()

    def abandon(self):
        """After a lost ps: its threads stopped and its sessions closed,
        once, however many attempts a recovery makes; what its threads
        met, the lost ps, is not raised."""
        closes, self.closes = self.closes, []
        stop(self.coord, closes)


def stop(coord, closes):
    """coord's threads told to stop, and each of closes called, within
    STOP_SECS each: each may wait on a ps that froze as it left."""
    coord.request_stop()
    for close in closes:
        with contextlib.suppress(TimeoutError, tf.errors.OpError,
                                 RuntimeError):
            call_within(CoordinatedSession.STOP_SECS, close)


def open_session(sv, target, config, cluster, watch, coord, deadline, logdir,
                 reopened=False, chief_left=None):
    """The Supervisor's session, or TaskFailed saying why not, within the
    deadline; the chief's `logdir` is a Logdir. The chief joins the model
    if the ps tasks hold it (a ps that never left, while the chief was
    away): newer than any checkpoint, and what Supervisor would otherwise
    initialize again under the workers. The others wait for the model,
    and raise a failure a thread stores in coord meanwhile, or the chief's
    reason once chief_left() says it left."""
    if not sv.is_chief:
        return _wait_for_the_model(sv, target, config, cluster, watch, coord,
                                   deadline, chief_left)
    # The model the ps tasks hold, if ready, as the others wait for it.
    with contextlib.suppress(tf.errors.DeadlineExceededError):
        with watch.calling('joining the live model', deadline=deadline):
            sess = sv.session_manager.wait_for_session(target, config=config,
                                                       max_wait_secs=0)
        with watch.calling('reading the global step', sess):
            step = sess.run(sv.global_step)
        print('worker=0: joined the live model on the ps at global_step=%d'
              % step, flush=True)
        return sess
    checkpoint = logdir and tf.train.latest_checkpoint(logdir.path)
    try:
        # sv.prepare_or_wait_for_session() but for its graph's write, which
        # a full --logdir would fail, the session lost.
        with watch.calling('opening a session', deadline=deadline):
            sess = sv.session_manager.prepare_session(
                target, init_op=sv.init_op, saver=sv.saver,
                checkpoint_dir=logdir and logdir.path, config=config,
                init_feed_dict=sv.init_feed_dict)
    except (tf.errors.DataLossError, tf.errors.InvalidArgumentError,
            tf.errors.NotFoundError) as e:
        if not checkpoint:
            raise
        raise TaskFailed('cannot restore the checkpoint %s (%s): move it '
                         'away, or choose another %s'
                         % (checkpoint, errors.what_went_wrong(e), LOGDIR))
    except RuntimeError as e:
        # A ps that restarted as the chief initialized it lost the model.
        raise tf.errors.AbortedError(None, None, 'the model is not ready '
                                     'once initialized: %s' % e)
    if logdir:
        logdir.write_graph(sv)
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
            'no checkpoint in %s yet' % LOGDIR if logdir
            else 'without %s there is no checkpoint to restore' % LOGDIR),
            flush=True)
    else:
        print('worker=0: initialized the model', flush=True)
    return sess


def _wait_for_the_model(sv, target, config, cluster, watch, coord, deadline,
                        chief_left):
    """A worker's session once the chief has made the model ready,
    checking every second; the Supervisor's own wait could not be left for
    a failure stored."""
    chief = '/job:worker/task:0 (%s)' % cluster.task_address('worker', 0)
    while True:
        try:
            with watch.calling('the wait for the model', deadline=deadline):
                return sv.session_manager.wait_for_session(
                    target, config=config, max_wait_secs=0)
        except tf.errors.DeadlineExceededError:
            if not deadline.left():
                raise TaskFailed('the chief, %s, did not initialize the '
                                 'model %s' % (chief, deadline))
        reason = chief_left and chief_left()
        if reason is not None:
            raise TaskFailed('the chief, %s, went away before the model was '
                             'ready: "%s"' % (chief, reason))
        if coord.wait_for_stop(1):
            coord.raise_requested_exception()
            raise TaskFailed('stopped before the model was ready')
