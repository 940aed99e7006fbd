"""The session a worker trains in, as TensorFlow's _RecoverableSession
keeps one: a run that lost a ps task is run again in a new session, which
its creator makes once the ps answers again."""

import tensorflow.compat.v1 as tf

from ps_cluster import errors, liveness
from ps_cluster.deadlines import poll
from ps_cluster.exits import TaskFailed


class RecoverableSession:
    """The session of `creator` (session_start.SessionCreator), created at
    open(), and again whenever a run or the close meets a lost ps, attempt
    after attempt until the wait for it, on the clock `outage` (a
    deadlines.Outage, --ps_timeout's) that the stall watch reads too, is
    over; only the main thread runs in it."""

    def __init__(self, creator, outage):
        self.creator, self.outage = creator, outage
        self.session = None

    def open(self):
        """The first session; a ps lost as it opens ends the task."""
        lost = self._attempt()
        if lost:
            raise TaskFailed(self.creator.lost(lost))
        return self

    def run(self, fetches, feed_dict=None):
        while True:
            try:
                return self.session.run(fetches, feed_dict)
            except tf.errors.OpError as e:
                if not errors.is_lost(e):
                    raise
                self._recover(e)

    def _recover(self, error):
        # One wait a loss, from when it was found, every attempt within it.
        deadline = self.outage.deadline()
        # Meanwhile this worker beats on the ps tasks that stayed; an
        # attempt each of the Watchdog's polls.
        place = self.creator.place
        with liveness.beating(place.cluster, place.index):
            self.creator.recovering(error, deadline)
            if not poll(lambda: not self._attempt(deadline),
                        deadline.left(), liveness.POLL_SECS):
                raise TaskFailed((
                    '%s; no new session carried the run on %s'
                    % (error.message, deadline))
                    if isinstance(error, errors.Stuck) else
                    '%s, which did not come back %s'
                    % (self.creator.lost(error), deadline))
        self.outage.over()

    def _attempt(self, deadline=None):
        """A new session, which asks whether the ps tasks are back within
        deadline (a recovery's); None, or the error of a lost ps (another
        is raised)."""
        try:
            self.session = self.creator.create_session(deadline)
        except tf.errors.OpError as e:
            if not errors.is_lost(e):
                raise
            return e
        return None

    def close(self):
        """The session's close(): the chief's last checkpoint, this worker
        marked done; after a ps lost meanwhile, in a new session."""
        while True:
            try:
                return self.session.close()
            except tf.errors.OpError as e:
                if not errors.is_lost(e):
                    raise
                self._recover(e)
