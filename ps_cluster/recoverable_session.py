"""The session a worker trains in, as TensorFlow's _RecoverableSession
keeps one: a run that lost a ps task is run again in a new session, which
its creator makes once the ps answers again."""

import tensorflow.compat.v1 as tf

from ps_cluster import errors


class RecoverableSession:
    """The session of `creator` (session_start.SessionCreator), created at
    open(), and again whenever a run meets a lost ps; only the main thread
    runs in it."""

    def __init__(self, creator):
        self.creator = creator
        self.session = None

    def open(self):
        self.session = self.creator.create_session()
        return self

    def run(self, fetches, feed_dict=None):
        while True:
            try:
                return self.session.run(fetches, feed_dict)
            except tf.errors.OpError as e:
                if not errors.is_lost(e):
                    raise
                self.session = self.creator.create_session()

    def wait_for_the_others(self):
        self.session.wait_for_the_others()

    def close(self):
        self.session.close()
