"""SyncReplicasOptimizer's tokens: how the chief starts the updates in each
new session, and what the workers do with the token queue when a task is
lost or done, so that no worker waits for a token forever."""

import tensorflow.compat.v1 as tf


class SyncTokens(tf.train.SessionRunHook):
    """The token ops of a wrapped optimizer: the book's chief_queue_runner
    and init_token_op, and those that free a waiting worker. A worker waits
    for a token after each step; the chief puts in one per worker for each
    update. last_step is where every worker stops. Not the optimizer's own
    make_session_run_hook(): its QueueRunner closes the token queue when it
    stops, a lost ps too, and then no worker could take a token again.
    """

    def __init__(self, optimizer, chief_queue_runner, init_token_op,
                 is_chief, global_step, last_step, num_workers):
        self.is_chief = is_chief
        self.global_step, self.last_step = global_step, last_step
        self.chief_queue_runner = chief_queue_runner
        self.init_tokens_op = init_token_op
        # A worker that is done leaves tokens for any other still waiting.
        self.release_op = optimizer.get_init_tokens_op(num_tokens=num_workers)
        self.add_token_op = optimizer.get_init_tokens_op(num_tokens=1)
        self._due, self._started = None, False

    def after_create_session(self, session, coord):
        """The chief's updates, in a thread of the session's (`coord` stops
        it), and the tokens that let the first step complete: in the
        first session once its first run, in which the script reads where
        training starts, has returned (after_run); the updates would move
        the step first. In a later session, after a lost ps, at once: the
        run it runs again may wait for a token."""
        self._due = session, coord
        if self._started:
            self._start()

    def after_run(self, run_context, run_values):
        if self._due:
            self._start()

    def _start(self):
        session, coord = self._due
        self._due, self._started = None, True
        if self.is_chief:
            tf.train.LooperThread.loop(
                coord, None, session.run,
                args=(self.chief_queue_runner.enqueue_ops,))
            session.run(self.init_tokens_op)

    def on_departure(self, session):
        """A worker went away: whether it is gone rather than done (it left
        at the last step); if gone, the chief puts back a token. One that
        died while it waited for a token took one with it, and the others
        would wait forever for the gradient it owed."""
        if session.run(self.global_step) >= self.last_step:
            return False
        if self.is_chief:
            session.run(self.add_token_op)
        return True

    def release(self, session):
        """This worker is done: tokens for every other one still waiting."""
        session.run(self.release_op)
