"""MNIST softmax regression, trained by parameter servers with asynchronous
updates: every worker applies its own gradients to the shared variables as
soon as it has computed them.

The ps tasks hold the variables and serve them; each worker reads them,
computes the gradient of its own batch, and sends it back to be applied.
Worker 0, the chief, also initializes the variables (or restores them from a
checkpoint) and writes checkpoints and summaries.

Start one process per task, for example on one machine:
    python mnist_dist_async.py --job_name=ps --task_index=0
    python mnist_dist_async.py --job_name=worker --task_index=0   # the chief
    python mnist_dist_async.py --job_name=worker --task_index=1
    python mnist_dist_async.py --job_name=worker --task_index=2
The cluster's flags (--ps, --worker, --data_dir, --logdir...) are in
cluster_utils.py.
"""

import os
import time

# TensorFlow prints pages of C++ start-up lines unless told before its import.
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import numpy as np  # noqa: E402
import tensorflow.compat.v1 as tf  # noqa: E402
from absl import app, flags  # noqa: E402

import cluster_utils  # noqa: E402
import liveness  # noqa: E402
import mnist_data  # noqa: E402
import training_session  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_float('learning_rate', 0.01, 'Learning rate of gradient descent.')
flags.DEFINE_integer('batch_size', 100, 'Images per training step.',
                     lower_bound=1)
flags.DEFINE_integer('epochs', 50,
                     'Passes of each worker over the training set.',
                     lower_bound=1)
flags.DEFINE_integer('step_delay_ms', 0,
                     'Sleep this long after each session.run: a straggler '
                     'on purpose, for bench.py.', lower_bound=0)
flags.register_validator('learning_rate', lambda v: v > 0, 'must be positive')
# ASYNC: the speed-up of bench.py's table; 1 is the book's step.
flags.DEFINE_integer('steps_per_run', 1,
                     'Training steps per session.run, each on its own batch '
                     'and on the shared variables as the step before left '
                     'them.', lower_bound=1)


def main(_):
    cluster_utils.exit_on_signals()
    tf.logging.set_verbosity(tf.logging.ERROR)  # else the next line warns
    tf.disable_v2_behavior()  # graphs and sessions, as in TensorFlow 1.x
    cluster = cluster_utils.cluster_spec_from_flags()
    server = cluster_utils.start_server(cluster)

    if FLAGS.job_name == 'ps':
        liveness.serve_until_workers_gone(server, cluster)
        cluster_utils.leave()

    steps_per_run = FLAGS.steps_per_run  # ASYNC: made as below
    mnist = cluster_utils.load_mnist(cluster,
                                     FLAGS.batch_size * steps_per_run)
    is_chief = FLAGS.task_index == 0

    # Variables go to the ps tasks, the computation stays on this worker.
    # They are spread round robin over the ps tasks, so with two or more, w,
    # by far the biggest, has a ps of its own; by size would place it alike.
    with tf.device(tf.train.replica_device_setter(
            worker_device='/job:worker/task:%d' % FLAGS.task_index,
            cluster=cluster)):
        global_step = tf.train.get_or_create_global_step()

        # The book's model: softmax regression of the 784 pixels.
        x = tf.placeholder(tf.float32, [None, mnist_data.IMAGE_PIXELS])
        y_ = tf.placeholder(tf.float32, [None, mnist_data.NUM_CLASSES])
        w = tf.Variable(tf.random_normal(
            [mnist_data.IMAGE_PIXELS, mnist_data.NUM_CLASSES]), name='w')
        b = tf.Variable(tf.random_normal([mnist_data.NUM_CLASSES]), name='b')
        logits = tf.matmul(x, w) + b
        correct = tf.equal(tf.argmax(logits, 1), tf.argmax(y_, 1))
        accuracy = tf.reduce_mean(tf.cast(correct, tf.float32))

        opt = tf.train.GradientDescentOptimizer(FLAGS.learning_rate)

        # ASYNC: a session.run feeds the batches of --steps_per_run steps,
        # made one after the other: each step after the first reads w and b
        # on the ps once the step before has updated them.
        train_op = None
        for k in range(steps_per_run):
            with tf.control_dependencies([train_op] if train_op else []):
                with tf.device(w.device):
                    w_now = w.read_value()
                with tf.device(b.device):
                    b_now = b.read_value()
            rows = slice(k * FLAGS.batch_size, (k + 1) * FLAGS.batch_size)
            loss = tf.reduce_mean(tf.nn.softmax_cross_entropy_with_logits_v2(
                labels=y_[rows], logits=tf.matmul(x[rows], w_now) + b_now))
            train_op = opt.minimize(loss, global_step=global_step)

    # The chief initializes the variables, or restores them from the last
    # checkpoint in --logdir; the others wait for it, checking every second
    # instead of Supervisor's default 30. Its checkpoints come from
    # training_session.RecoverableSession: a failed save stops the
    # Supervisor's own.
    sv = tf.train.Supervisor(
        is_chief=is_chief,
        logdir=FLAGS.logdir,
        global_step=global_step,
        init_op=tf.global_variables_initializer(),
        recovery_wait_secs=1,
        save_model_secs=0)
    sess = training_session.RecoverableSession(sv, server, cluster)

    # Global steps count the steps of all workers. A run resumed from a
    # checkpoint in --logdir ends where the whole run would have.
    steps_per_epoch = len(mnist.train.images) // FLAGS.batch_size
    last_step = FLAGS.epochs * steps_per_epoch * cluster.num_tasks('worker')

    def accuracy_on(split):
        return float(sess.run(accuracy, {x: split.images, y_: split.labels}))

    rng = np.random.default_rng(FLAGS.task_index)
    step = sess.run(global_step)
    log = cluster_utils.TrainingLog(sv, sess, step, accuracy_on, mnist)
    for epoch in range(FLAGS.epochs):
        if step >= last_step:
            break
        for batch_x, batch_y in mnist_data.epoch_batches(
                mnist.train, FLAGS.batch_size * steps_per_run, rng):
            _, loss_value, step = sess.run(
                [train_op, loss, global_step],
                feed_dict={x: batch_x, y_: batch_y})
            log.step(step, loss_value, steps_per_run)
            if FLAGS.step_delay_ms:
                time.sleep(FLAGS.step_delay_ms / 1000)
        log.epoch(epoch, step, loss_value)
    final_accuracy = accuracy_on(mnist.test)
    print('worker=%d, final accuracy = %s'
          % (FLAGS.task_index, final_accuracy), flush=True)
    log.final(step, final_accuracy)
    sess.close()
    cluster_utils.leave()


if __name__ == '__main__':
    app.run(main, flags_parser=cluster_utils.parse_flags)
