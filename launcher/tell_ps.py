"""Tells the ps tasks that a worker will not come back, and why: its slot
marked LEFT, as a worker that fails marks its own. launch_local.sh runs it
for a worker that a signal killed, which could say nothing: the ps tasks
then end once the other workers have, naming it, instead of waiting
--worker_timeout for it. Without a launcher, a ps sees only the silence,
which a restarted or cut-off worker shows too.

    python -m launcher.tell_ps PS_HOSTS WORKER_HOSTS TASK_INDEX REASON
"""

import os
import sys

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
os.environ.setdefault('TF_USE_LEGACY_KERAS', '1')  # as the scripts do

import tensorflow.compat.v1 as tf  # noqa: E402

from ps_cluster import liveness, sources  # noqa: E402


def main(ps_hosts, worker_hosts, task_index, reason):
    tf.logging.set_verbosity(tf.logging.ERROR)
    tf.disable_v2_behavior()
    liveness.say_left(sources.from_host_lists(ps_hosts, worker_hosts),
                      int(task_index), reason)


if __name__ == '__main__':
    main(*sys.argv[1:])
