"""Where the model's variables live (ps_cluster/worker/placement.py), as the
scripts' device setter places them."""

import tensorflow.compat.v1 as tf

import mnist_data
from ps_cluster import sources
from ps_cluster.worker import placement


def placed(num_ps):
    """The lines of the book's model and global step, placed round robin
    on num_ps ps tasks."""
    cluster = tf.train.ClusterSpec({
        'ps': ['ps%d:1' % i for i in range(num_ps)], 'worker': ['w:1']})
    with tf.Graph().as_default():
        with tf.device(tf.train.replica_device_setter(
                worker_device='/job:worker/task:0', cluster=cluster)):
            global_step = tf.train.get_or_create_global_step()
            tf.Variable(tf.zeros([mnist_data.IMAGE_PIXELS,
                                  mnist_data.NUM_CLASSES]), name='w')
            tf.Variable(tf.zeros([mnist_data.NUM_CLASSES]), name='b')
        return placement.lines(tf.trainable_variables() + [global_step],
                               sources.Place(cluster, 'worker', 0).tasks('ps'))


def test_round_robin_puts_the_model_on_one_ps():
    # 784 x 10 floats of w, 10 of b, the 8-byte global step.
    assert placed(1) == [
        '/job:ps/task:0 (ps0:1) holds b, global_step, w: 31,408 bytes, '
        '100.0% of the model']
    assert placed(3) == [
        '/job:ps/task:0 (ps0:1) holds global_step: 8 bytes, 0.0% of the '
        'model',
        '/job:ps/task:1 (ps1:1) holds w: 31,360 bytes, 99.8% of the model',
        '/job:ps/task:2 (ps2:1) holds b: 40 bytes, 0.1% of the model']
    # A fourth holds nothing.
    assert placed(4)[3] == ('/job:ps/task:3 (ps3:1) holds nothing: 0 bytes, '
                            '0.0% of the model')


def test_a_partitioner_gives_each_ps_a_shard():
    # As --split_w makes w: a shard of 392 x 10 floats on each of 2 ps.
    cluster = tf.train.ClusterSpec({'ps': ['ps0:1', 'ps1:1'],
                                    'worker': ['w:1']})
    with tf.Graph().as_default():
        with tf.device(tf.train.replica_device_setter(
                worker_device='/job:worker/task:0', cluster=cluster)):
            global_step = tf.train.get_or_create_global_step()
            tf.get_variable('w', [mnist_data.IMAGE_PIXELS,
                                  mnist_data.NUM_CLASSES],
                            partitioner=tf.fixed_size_partitioner(2))
            tf.get_variable('b', [mnist_data.NUM_CLASSES])
        ps_tasks = sources.Place(cluster, 'worker', 0).tasks('ps')
        assert placement.lines(tf.trainable_variables() + [global_step],
                               ps_tasks) == [
            '/job:ps/task:0 (ps0:1) holds global_step, w/part_1: 15,688 '
            'bytes, 49.9% of the model',
            '/job:ps/task:1 (ps1:1) holds b, w/part_0: 15,720 bytes, 50.1% '
            'of the model']
