"""TensorFlow 2's coordinator started again after a lost ps, as a new
process image from its last checkpoint: its coordinator cannot make the
variables again on a ps that lost them."""

import os
import sys
import time

from ps_cluster import errors, probes
from ps_cluster.deadlines import poll
from ps_cluster.exits import TaskFailed
from ps_cluster.settings import LOGDIR

# How many times in a row the coordinator starts again, each after twice
# the wait of the one before, from a second: a ps lost again at once, five
# times, is no longer one a scheduler brings back. Counted across its
# process images in the environment; an epoch done ends the row.
RESTARTS, RESTARTS_VARIABLE = 5, 'MNIST_DIST_TF2_RESTARTS'


def epoch_done():
    """An epoch done ends a row of starts again."""
    os.environ.pop(RESTARTS_VARIABLE, None)


def start_again(error, servers, ps_timeout):
    """After `error`, a lost ps's: waits for every ps of `servers` (a
    Servers) to answer, and starts this coordinator again, as a new
    process image with the same arguments, from its last checkpoint in
    logdir, if any (else from new variables, as a TF1 run without one); or
    raises TaskFailed once ps_timeout (a Limit) has passed."""
    index = servers.task_index
    silent = servers.not_answering('ps')
    if silent:
        print('worker=%d: lost the connection to %s (%s): waiting up to %s '
              'for it to come back' % (index, *silent[0], ps_timeout),
              flush=True)
    else:  # a ps started again in the meantime
        print('worker=%d: lost a ps task (%s); every ps answers' % (
            index, errors.what_went_wrong(error)), flush=True)
    for name, address in silent:
        if not poll(lambda: probes.answers(address), ps_timeout.secs, 1):
            raise TaskFailed('lost the connection to %s (%s), which did not '
                             'come back within %s'
                             % (name, address, ps_timeout))
    restart = int(os.environ.get(RESTARTS_VARIABLE, 0)) + 1
    if restart > RESTARTS:
        raise TaskFailed('lost a ps task %d times in a row, without an '
                         'epoch between: %s' % (
                             RESTARTS, errors.what_went_wrong(error)))
    print('worker=%d: starting again (%d of %d times in a row) in %d s, from '
          'the last checkpoint in %s if there is one'
          % (index, restart, RESTARTS, 2 ** (restart - 1), LOGDIR),
          flush=True)
    time.sleep(2 ** (restart - 1))
    os.environ[RESTARTS_VARIABLE] = str(restart)
    os.execv(sys.executable, [sys.executable] + sys.argv)
