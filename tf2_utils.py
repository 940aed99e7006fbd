"""The cluster side of mnist_dist_tf2.py, on cluster_utils.py's flags and
task: this task in TensorFlow 2's cluster (start_task()), from
ps_cluster/tf2/ beneath (TensorFlow 2 only: the TF1 scripts do not import
it)."""

import cluster_utils
from ps_cluster import exits
from ps_cluster.tf2.coordinator import Coordinator
from ps_cluster.tf2.task import Tf2Task


def start_task():
    """This task of TensorFlow 2's cluster, set to end in one line as the
    TF1 scripts' tasks are (cluster_utils.start_task()): a Tf2Task, or the
    coordinator, worker 0, a Coordinator; or one line and exit status 2 for
    a flag TensorFlow 2's run cannot take."""
    task = cluster_utils.start_task(sync=False, coordinator=True)
    workers = task.cluster['worker']
    if task.job_name == 'evaluator' and task.settings.split_w:
        exits.usage_error('--split_w: an evaluator reads w whole, and '
                          'TensorFlow 2 checkpoints its shards apart')
    if task.settings.shard_data:
        exits.usage_error('--shard_data: mnist_dist_tf2.py\'s workers read '
                          'the coordinator\'s data, all of it')
    if len(workers) < 2:
        exits.usage_error('--worker lists %d task(s): TensorFlow 2 needs a '
                          'coordinator, worker 0, and a worker to train'
                          % len(workers))
    if task.job_name == 'worker' and task.index == 0:
        return Coordinator(task)
    return Tf2Task(task)
