"""SyncReplicasOptimizer's tokens: how the chief starts the updates, and
what the workers do with the token queue when a task is lost or done, so
that no worker waits for a token forever."""


class SyncTokens:
    """The token ops of a wrapped optimizer: the book's chief_queue_runner
    and init_token_op, and those that free a waiting worker.

    A worker waits for a token after each step, and the chief puts in one
    per worker for each update. last_step is where every worker stops.
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

    def start_updates(self, sv, sess):
        """The chief applies the aggregated gradients, and puts in the
        tokens that let the first step complete: now, and in each new
        session after a lost ps.

        In a loop of the Supervisor's, not as the book's QueueRunner: that
        closes the token queue whenever it stops, a lost ps too, and then no
        worker could take a token again.
        """
        def start(session):
            sv.loop(None, session.run,
                    args=(self.chief_queue_runner.enqueue_ops,))
            session.run(self.init_tokens_op)
        sess.on_each_session(start)

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

    def free_a_waiting_worker(self, session):
        """A lost ps stops the chief's updates, and a worker may wait for a
        token, on a ps that stayed, that no update will give: each worker
        puts them in until it is freed, to meet the lost ps at its next
        step."""
        session.run(self.add_token_op)

    def release(self, session):
        """This worker is done: tokens for every other one still waiting."""
        session.run(self.release_op)
