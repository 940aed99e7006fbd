"""How the servers of a TensorFlow 2 cluster end: each ps and worker holds
a word that the coordinator sets as it ends, and leaves once it is set, or
once the coordinator has been silent too long; TensorFlow 2's servers never
end on their own."""

import time

import tensorflow.compat.v1 as tf

from ps_cluster import probes, server
from ps_cluster.deadlines import call_within, poll
from ps_cluster.exits import TaskFailed

# How long a word's read or write may take.
RUN_SECS = 2
# A word of the coordinator's: it finished its run.
DONE = 'done'
# A server's word that a scheduler preempted it (SIGTERM), which the
# coordinator answers once it has saved; and the start of the coordinator's
# word when it was preempted itself: its servers wait for it to come back.
PREEMPTED = 'preempted'


def _word(name):
    """The word on the task `name`, a string variable in a graph of TF1's
    own: a session of another process finds it by its name."""
    with tf.device(name):
        return tf.Variable('', name='coordinator_word', use_resource=False)


class Word:
    """A ps's or worker's word, read where it lies: on its own server,
    with no RPC."""

    def __init__(self, server, name):
        self.name = name
        with tf.Graph().as_default():
            self.word = _word(name)
            # Never initialized here: the coordinator may set it at any
            # moment of this start, and an initializer would write over it.
            self.sess = tf.Session(server.target, config=tf.ConfigProto(
                device_filters=[name]))
            self.value = tf.placeholder(tf.string, [])
            self.say = self.word.assign(self.value)
        self.preempting = False

    def preempted(self, grace):
        """Says that a scheduler preempted this server (SIGTERM), and waits
        up to a second before `grace` (a Limit) is over for the
        coordinator to save: returns this server's line."""
        self.preempting = True
        self.sess.run(self.say, {self.value: PREEMPTED})
        word = poll(lambda: self._read().replace(PREEMPTED, '', 1),
                    grace.secs - 1, 0.1)
        return PREEMPTED + (word or (
            '; the coordinator did not save the model within %s: its steps '
            'since its last checkpoint are lost' % (grace,)))

    def _read(self):
        try:
            return self.sess.run(self.word).decode()
        except tf.errors.FailedPreconditionError:  # not set yet
            return ''

    def wait(self, coordinator, startup_timeout, silent_timeout, ps=()):
        """Until the coordinator at `coordinator` (its name and address)
        sets the word, which is returned; TaskFailed if it does not come up
        within startup_timeout, or stops answering for silent_timeout (each
        a Limit; a restarted coordinator answers again). While it does not
        answer, a word it set on a ps task of `ps` ({name: address}), which
        it tells first, is taken as this task's."""
        name, address = coordinator
        heard = None
        started = time.monotonic()
        while True:
            word = self._read()
            if word.startswith(PREEMPTED) and not self.preempting:
                # The coordinator was preempted: a scheduler starts it again.
                print('%s: the coordinator, %s (%s), was %s; waiting for it'
                      % (self.name, name, address, word), flush=True)
                self.sess.run(self.say, {self.value: ''})
            elif word and not self.preempting:
                return word
            now = time.monotonic()
            if probes.answers(address, 1.0):
                heard = now
            else:
                # Its word on a ps task, told first, if it left before it
                # could tell this task.
                told = [word for word in (read(*task) for task in ps.items())
                        if word and not word.startswith(PREEMPTED)]
                if told:
                    return told[0]
                if heard is None and now - started > startup_timeout.secs:
                    raise TaskFailed('the coordinator, %s (%s), did not come '
                                     'up within %s' % (name, address,
                                                       startup_timeout))
                if heard is not None and now - heard > silent_timeout.secs:
                    raise TaskFailed('the coordinator, %s (%s), has not '
                                     'answered for %s' % (name, address,
                                                          silent_timeout))
            time.sleep(0.5)


def tell(tasks, word, secs):
    """Sets `word` on each of tasks ({name: address}) that answers, in
    sessions of its own, within secs (probes.tell_each()); returns the
    names of those it could not tell."""
    return probes.tell_each(tasks, lambda name: _set(name, tasks[name], word),
                            secs)


def read(name, address):
    """The word on the task `name` at address; None if it does not answer,
    at once (a frozen task accepts connections, and a run on it can block
    past its timeout)."""
    if not probes.answers(address, 1.0):
        return None
    with tf.Graph().as_default() as graph:
        fetch = _word(name)
    try:
        word = call_within(RUN_SECS, server.call_once, address, name, graph,
                           fetch, RUN_SECS)
    except TimeoutError:
        return None
    return word and word.decode()


def _set(name, address, word):
    with tf.Graph().as_default() as graph:
        return server.call_once(address, name, graph, _word(name).assign(
            word), RUN_SECS) is not None
