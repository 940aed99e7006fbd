"""For the in-process tests: a cluster of free ports, and the scripts'
model shrunk to 4 pixels and 2 classes, on one fixed batch."""

import tensorflow.compat.v1 as tf


def cluster_of(free_ports, num_ps=1, num_workers=2):
    """A cluster on free ports, where nothing listens until a test starts a
    task's server."""
    addresses = ['localhost:%d' % port
                 for port in free_ports(num_ps + num_workers)]
    return tf.train.ClusterSpec({'ps': addresses[:num_ps],
                                 'worker': addresses[num_ps:]})


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
