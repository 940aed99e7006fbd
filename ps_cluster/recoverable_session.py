"""The session a worker trains in, as TensorFlow's _RecoverableSession
keeps one: a run that lost a ps task is run again in a new session, which
its creator makes once the ps answers again."""

import time

import tensorflow.compat.v1 as tf

from ps_cluster import errors
from ps_cluster.deadlines import Deadline
from ps_cluster.exits import TaskFailed


class RecoverableSession:
    """The session of `creator` (session_start.SessionCreator), created at
    open(), and again whenever a run meets a lost ps, attempt after attempt
    until `secs` (--ps_timeout) have passed; only the main thread runs in
    it."""

    # How often an attempt is made.
    POLL_SECS = 0.5

    def __init__(self, creator, secs):
        self.creator, self.secs = creator, secs
        self.session = None

    def open(self):
        """The first session; a ps lost as it opens ends the task."""
        try:
            self.session = self.creator.create_session()
        except tf.errors.OpError as e:
            if errors.is_lost(e):
                raise TaskFailed(self.creator.lost(e))
            raise
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
        deadline = Deadline(self.secs, '--ps_timeout')
        self.creator.recovering(error, deadline)
        while True:
            try:
                self.session = self.creator.create_session()
                return
            except tf.errors.OpError as e:
                if not errors.is_lost(e):
                    raise
            if not deadline.left():
                raise TaskFailed('%s, which did not come back %s'
                                 % (self.creator.lost(error), deadline))
            time.sleep(self.POLL_SECS)

    def wait_for_the_others(self):
        self.session.wait_for_the_others()

    def close(self):
        self.session.close()
