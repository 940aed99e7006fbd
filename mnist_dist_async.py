"""MNIST softmax regression trained by parameter servers, asynchronously:
each worker applies its own gradients to the shared variables as soon as it
has computed them. The script of Mastering TensorFlow 1.x, chapter 15.

The ps tasks hold the variables, w and b, and serve them. Each worker reads
them, computes the gradient of its own batch, and sends it to the ps to be
applied. Worker 0, the chief, also initializes the variables, or restores
them from a checkpoint, and writes checkpoints and summaries.

Start one process per task, for example on one machine:
    python mnist_dist_async.py --job_name=ps --task_index=0
    python mnist_dist_async.py --job_name=worker --task_index=0   # the chief
    python mnist_dist_async.py --job_name=worker --task_index=1
    python mnist_dist_async.py --job_name=worker --task_index=2
The cluster's flags (--ps, --worker, --logdir...) are in cluster_utils.py.

A marker at the end of a statement's first line labels the statement, and
a comment above it that starts with the marker says more: # PS: it makes
the program distributed; # ASYNC: or # SYNC: it differs from
mnist_dist_sync.py; # BOOK: it stands for a line of the book's script,
quoted, and says why. Skip the # BOOK: statements and the rest is the
book's script, in its order (docs/book.md).
"""

import os
import time

# TensorFlow prints pages of C++ start-up lines unless told before its import.
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import numpy as np  # noqa: E402
import tensorflow.compat.v1 as tf  # noqa: E402 BOOK: import tensorflow as tf
from absl import app, flags  # noqa: E402

import cluster_utils  # noqa: E402 PS: the cluster's flags and calls
import mnist_data  # noqa: E402 BOOK: tensorflow.examples...input_data

FLAGS = flags.FLAGS
flags.DEFINE_float(  # BOOK: learning_rate = 0.01 in main; a flag
    'learning_rate', 0.01, 'Learning rate of gradient descent.')
flags.DEFINE_integer(  # BOOK: n_epochs = 50 in main; a flag
    'epochs', 50, 'Passes of each worker over the training set.',
    lower_bound=1)
flags.DEFINE_integer(  # BOOK: batch_size = 100 in main; a flag
    'batch_size', 100, 'Images per training step.', lower_bound=1)
flags.DEFINE_integer(  # BOOK: n_epochs_print = 10 in main; a flag
    'print_every_epochs', 10, 'Print the loss every this many epochs.',
    lower_bound=1)
flags.register_validator(  # BOOK: (none): a flag can be given wrong
    'learning_rate', lambda v: v > 0, 'must be positive')
flags.DEFINE_integer(  # PS: a straggler on purpose, for the benchmark
    'step_delay_ms', 0, 'Sleep this long after each session.run.',
    lower_bound=0)
flags.DEFINE_integer(  # ASYNC: the benchmark's speed-up; 1 is the book's
    'steps_per_run', 1, 'Training steps per session.run, each on its own '
    'batch.', lower_bound=1)


def model(x_p):
    """The book's model, softmax regression: the logits of the ten classes
    for images x_p of 784 pixels."""
    w = tf.Variable(tf.random_normal([mnist_data.IMAGE_PIXELS,
                                      mnist_data.NUM_CLASSES]), name='w')
    b = tf.Variable(tf.random_normal([mnist_data.NUM_CLASSES]), name='b')
    return tf.matmul(x_p, w) + b


def main(_):
    cluster_utils.exit_on_signals()  # PS: a signal ends a task in one line
    tf.logging.set_verbosity(tf.logging.ERROR)  # BOOK: (none): else it warns
    tf.disable_v2_behavior()  # BOOK: (none): TF 2.x runs 1.x graphs so
    # BOOK: clusterSpec = tf.train.ClusterSpec({'ps': ps, 'worker': workers})
    # of fixed lists; here from --ps/--worker, TF_CONFIG or Slurm.
    cluster = cluster_utils.cluster_spec()  # PS: BOOK:
    # BOOK: mnist = input_data.read_data_sets(...), first in main; a ps
    # needs no data. Read before the server starts: a task that cannot
    # train never joins. ASYNC: each session.run takes K batches.
    images_per_run = FLAGS.batch_size * FLAGS.steps_per_run  # ASYNC:
    mnist = cluster_utils.load_mnist(cluster, images_per_run)  # BOOK:
    server = cluster_utils.start_server(cluster)  # PS: BOOK: tf.train.Server

    if FLAGS.job_name == 'ps':  # PS:
        # BOOK: server.join(), which never returns; this ends the ps once
        # every worker has come and gone.
        cluster_utils.join(server, cluster)  # PS: BOOK:

    n_batches = len(mnist.train.images) // FLAGS.batch_size
    is_chief = FLAGS.task_index == 0  # PS: it initializes, saves, restores
    # ASYNC: global steps count every worker's steps; a resumed run ends
    # where the whole run would have.
    last_step = (FLAGS.epochs * n_batches  # ASYNC:
                 * cluster.num_tasks('worker'))

    # PS: an evaluator is no task of the cluster: it measures the chief's
    # checkpoints in --logdir, and ends once it has the run's last step.
    if FLAGS.job_name == 'evaluator':  # PS:
        cluster_utils.evaluate(model, mnist, last_step)

    # Variables go to the ps tasks, round robin, the computation to this
    # worker: with two ps or more, w, by far the biggest, has one of its own.
    with tf.device(tf.train.replica_device_setter(  # PS:
            worker_device='/job:worker/task:%d' % FLAGS.task_index,
            cluster=cluster)):
        global_step = tf.train.get_or_create_global_step()  # PS: on the ps

        x_p = tf.placeholder(tf.float32, [None, mnist_data.IMAGE_PIXELS])
        y_p = tf.placeholder(tf.float32, [None, mnist_data.NUM_CLASSES])
        logits = model(x_p)  # BOOK: w, b and logits, now at the top
        cross_entropy = tf.nn.softmax_cross_entropy_with_logits_v2(  # BOOK:
            labels=y_p, logits=logits)  # the book's _with_logits is gone
        loss_op = tf.reduce_mean(cross_entropy)
        optimizer = tf.train.GradientDescentOptimizer(FLAGS.learning_rate)
        train_op = optimizer.minimize(loss_op, global_step=global_step)
        if FLAGS.steps_per_run > 1:  # ASYNC: K steps a run, built below
            train_op, loss_op = several_steps(optimizer, x_p, y_p, global_step)

        correct_pred = tf.equal(tf.argmax(logits, 1), tf.argmax(y_p, 1))
        accuracy_op = tf.reduce_mean(tf.cast(correct_pred, tf.float32))

    # PS: the chief writes checkpoints and summaries in --logdir, from the
    # session below (a failed save would stop the Supervisor's own), named
    # relative to it, so a copied or moved logdir resumes from its own; the
    # others check for the model every second, not every 30.
    sv = tf.train.Supervisor(is_chief=is_chief,  # PS:
                             logdir=FLAGS.logdir,
                             init_op=tf.global_variables_initializer(),
                             global_step=global_step,
                             saver=tf.train.Saver(save_relative_paths=True),
                             recovery_wait_secs=1,
                             save_model_secs=0)

    # BOOK: with sv.prepare_or_wait_for_session(server.target) as mts:
    # a session that outlives a lost ps.
    sess = cluster_utils.training_session(sv, server, cluster)  # PS: BOOK:

    rng = np.random.default_rng(FLAGS.task_index)  # BOOK: next_batch's order
    gstep = sess.run(global_step)  # PS: where a resumed run starts
    log = cluster_utils.training_log(  # PS: pace, totals and TensorBoard
        sv, sess, gstep, mnist, accuracy_op, x_p, y_p)
    lstep = 0
    for epoch in range(FLAGS.epochs):  # ASYNC: every worker its own epochs
        if gstep >= last_step:  # ASYNC: a resumed run ends where it would
            break
        for x_batch, y_batch in mnist_data.epoch_batches(  # BOOK: next_batch
                mnist.train, images_per_run, rng):
            feed_dict = {x_p: x_batch, y_p: y_batch}
            _, loss, gstep = sess.run(  # ASYNC: the book's step
                [train_op, loss_op, global_step], feed_dict=feed_dict)
            lstep += FLAGS.steps_per_run  # ASYNC:
            log.step(gstep, lstep, loss)  # PS:
            time.sleep(FLAGS.step_delay_ms / 1000)  # PS: a straggler
        if (epoch + 1) % FLAGS.print_every_epochs == 0:  # ASYNC: each epoch
            print('worker=%d,epoch=%d,global_step=%d, local_step=%d, loss=%s'
                  % (FLAGS.task_index, epoch, gstep, lstep, loss), flush=True)
            log.accuracies(gstep)  # PS:
    feed_dict = {x_p: mnist.test.images, y_p: mnist.test.labels}
    accuracy = sess.run(accuracy_op, feed_dict=feed_dict)
    print('worker=%d, final accuracy = %s' % (FLAGS.task_index, accuracy),
          flush=True)
    log.final(gstep, accuracy)  # PS:
    cluster_utils.export(sess, model, mnist)  # PS: --export_dir, the chief
    sess.close()  # BOOK: the with block's end; it tells the ps it is done
    cluster_utils.leave()  # PS: at once: TensorFlow cannot stop its server


def several_steps(optimizer, x_p, y_p, global_step):  # ASYNC:
    """The train_op and loss_op of --steps_per_run steps in one session.run:
    the batches of all of them fed at once, the steps made one after the
    other, each reading w and b on the ps once the step before has updated
    them. It saves the dispatch and a round trip of all steps but one."""
    w, b = tf.trainable_variables()
    train_op = None
    for k in range(FLAGS.steps_per_run):
        with tf.control_dependencies([train_op] if train_op else []):
            with tf.device(w.device):
                w_now = w.read_value()
            with tf.device(b.device):
                b_now = b.read_value()
        rows = slice(k * FLAGS.batch_size, (k + 1) * FLAGS.batch_size)
        loss_op = tf.reduce_mean(tf.nn.softmax_cross_entropy_with_logits_v2(
            labels=y_p[rows], logits=tf.matmul(x_p[rows], w_now) + b_now))
        train_op = optimizer.minimize(loss_op, global_step=global_step)
    return train_op, loss_op


if __name__ == '__main__':
    app.run(main, flags_parser=cluster_utils.parse_flags)  # BOOK: tf.app.run()
