"""For the in-process tests: servers in the test's own process, a cluster of
free ports, and the scripts' model shrunk to 4 pixels and 2 classes, on one
fixed batch.

TensorFlow cannot stop a server (about 95 threads each), so the tests of a
pytest run share one set, SHARED_SHAPE large, each test starting from empty
resource containers (shared_cluster); a test that needs a fresh ps, or a
task that must not be up yet, takes a cluster of free ports instead
(cluster_of), whose servers it starts."""

import tensorflow.compat.v1 as tf

from ps_cluster import server as task_server

# ps tasks and workers of the shared servers.
SHARED_SHAPE = (2, 4)
# This run's servers, by address.
_servers = {}
_shared = []


def cluster_of(free_ports, num_ps=1, num_workers=2):
    """A cluster on free ports, where nothing listens until a test starts a
    task's server."""
    addresses = ['localhost:%d' % port
                 for port in free_ports(num_ps + num_workers)]
    return tf.train.ClusterSpec({'ps': addresses[:num_ps],
                                 'worker': addresses[num_ps:]})


def server(cluster, job, index):
    """The server of task (job, index) of cluster, as the scripts configure
    it: the one of this run at its address, if any; else a new one."""
    address = cluster.task_address(job, index)
    if address not in _servers:
        _servers[address] = tf.train.Server(
            cluster, job_name=job, task_index=index,
            config=task_server.session_config(job, index))
    return _servers[address]


def shared_cluster(free_ports, num_ps=1, num_workers=2):
    """The first num_ps ps tasks and num_workers workers of the shared
    servers, started at the first call, every resource container of theirs
    emptied (the variables of the tests before: Session.reset)."""
    if not _shared:
        _shared.append(cluster_of(free_ports, *SHARED_SHAPE))
        for job in ('ps', 'worker'):
            for index in range(_shared[0].num_tasks(job)):
                server(_shared[0], job, index)
    spec = _shared[0]
    assert num_ps <= spec.num_tasks('ps')
    assert num_workers <= spec.num_tasks('worker')
    for job in ('ps', 'worker'):
        for address in spec.job_tasks(job):
            tf.Session.reset(_servers[address].target)
    return tf.train.ClusterSpec({'ps': spec.job_tasks('ps')[:num_ps],
                                 'worker': spec.job_tasks('worker')[
                                     :num_workers]})


def step_and_loss():
    """In the default graph and device scope: the global step, and the loss
    of softmax regression with variables w and b."""
    global_step = tf.train.get_or_create_global_step()
    w = tf.Variable(tf.random_normal([4, 2]), name='w')
    b = tf.Variable(tf.random_normal([2]), name='b')
    loss = tf.reduce_mean(tf.nn.softmax_cross_entropy_with_logits_v2(
        labels=tf.one_hot(tf.zeros([8], tf.int32), 2),
        logits=tf.matmul(tf.ones([8, 4]), w) + b))
    return global_step, loss


def placed(cluster, index):
    """The scripts' device scope for worker `index`: the variables on the
    ps tasks, the rest on the worker."""
    return tf.device(tf.train.replica_device_setter(
        worker_device='/job:worker/task:%d' % index, cluster=cluster))


def training_step(cluster, index):
    """Builds in the default graph, under placed(), step_and_loss()'s model
    and its gradient descent training step, as worker `index` of the
    scripts builds theirs; returns (global_step, train_op)."""
    with placed(cluster, index):
        global_step, loss = step_and_loss()
        return global_step, tf.train.GradientDescentOptimizer(0.1).minimize(
            loss, global_step=global_step)
