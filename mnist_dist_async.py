"""MNIST softmax regression, trained by parameter servers with asynchronous
updates: every worker applies its own gradients to the shared variables as
soon as it has computed them.

Start one process per task, for example on one machine:
    python mnist_dist_async.py --job_name=ps --task_index=0
    python mnist_dist_async.py --job_name=worker --task_index=0   # the chief
    python mnist_dist_async.py --job_name=worker --task_index=1
    python mnist_dist_async.py --job_name=worker --task_index=2
"""

import numpy as np
from absl import app

import cluster_utils
import mnist_data
from cluster_utils import FLAGS, tf


def main(_):
    cluster_utils.exit_on_signals()
    cluster = cluster_utils.cluster_spec_from_flags()
    server = cluster_utils.start_server(cluster)

    if FLAGS.job_name == 'ps':
        cluster_utils.serve_until_workers_gone(cluster)
        cluster_utils.leave()

    mnist = cluster_utils.load_mnist(cluster)
    is_chief = FLAGS.task_index == 0

    # Variables go to the ps tasks, the computation stays on this worker.
    # They are spread round robin over the ps tasks, so with two or more, w,
    # by far the biggest, has a ps of its own; by size would place it alike.
    with tf.device(tf.train.replica_device_setter(
            worker_device='/job:worker/task:%d' % FLAGS.task_index,
            cluster=cluster)):
        global_step = tf.train.get_or_create_global_step()
        model = cluster_utils.softmax_regression()
        opt = tf.train.GradientDescentOptimizer(FLAGS.learning_rate)
        train_op = opt.minimize(model.loss, global_step=global_step)

    # The chief initializes the variables, or restores them from the last
    # checkpoint in --logdir, and saves them there every minute; the others
    # wait for it, checking every second instead of Supervisor's default 30.
    sv = tf.train.Supervisor(
        is_chief=is_chief,
        logdir=FLAGS.logdir,
        global_step=global_step,
        init_op=tf.global_variables_initializer(),
        recovery_wait_secs=1,
        save_model_secs=60)
    sess = cluster_utils.supervised_session(sv, server, cluster)

    # Global steps count the steps of all workers. A run resumed from a
    # checkpoint in --logdir ends where the whole run would have.
    steps_per_epoch = len(mnist.train.images) // FLAGS.batch_size
    last_step = FLAGS.epochs * steps_per_epoch * cluster.num_tasks('worker')

    rng = np.random.default_rng(FLAGS.task_index)
    with cluster_utils.exit_if_cluster_lost(cluster):
        step = sess.run(global_step)
        log = cluster_utils.TrainingLog(sv, sess, model, mnist, step)
        for epoch in range(FLAGS.epochs):
            if step >= last_step:
                break
            for batch_x, batch_y in mnist_data.epoch_batches(
                    mnist.train, FLAGS.batch_size, rng):
                _, loss, step = sess.run(
                    [train_op, model.loss, global_step],
                    feed_dict={model.x: batch_x, model.y_: batch_y})
                log.step(step, loss)
            log.epoch(epoch, step, loss)
        log.final(step)
    cluster_utils.close_session(sv, sess)
    cluster_utils.leave()


if __name__ == '__main__':
    app.run(main, flags_parser=cluster_utils.parse_flags)
