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
--help lists every flag, the cluster's too.

A comment that starts with PS: says why the block below it, up to the next
blank line, makes the program distributed; ASYNC: or SYNC:, why it differs
from mnist_dist_sync.py. Elsewhere the two differ only in what sync passes
to start_task(), to the Supervisor and to its session. docs/book.md quotes
the book's lines beside the ones that stand for them.
"""

import os

# TensorFlow's C++ logs pages at start-up, and on a machine without a GPU
# an ERROR line (cuInit failed) that reads as ours: FATAL only.
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
# TensorFlow 2.x imports Keras 3 as it starts, a third of each task's
# start-up, which these graphs do not use; with this it looks for Keras 2
# (tf_keras) instead, and starts without it.
os.environ.setdefault('TF_USE_LEGACY_KERAS', '1')

import numpy as np  # noqa: E402
import tensorflow.compat.v1 as tf  # noqa: E402
from absl import app, flags  # noqa: E402

import cluster_utils  # noqa: E402
import mnist_data  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_float('learning_rate', 0.01, 'Learning rate of gradient descent.')
flags.register_validator('learning_rate', lambda v: v > 0, 'must be positive')
flags.DEFINE_integer('epochs', 50, 'Passes of each worker over the training '
                     'set.', lower_bound=1)
flags.DEFINE_integer('batch_size', 100, 'Images per training step.',
                     lower_bound=1)
flags.DEFINE_integer('print_every_epochs', 10, 'Print the loss every this '
                     'many epochs.', lower_bound=1)
flags.DEFINE_integer('step_delay_ms', 0, 'A straggler on purpose: each '
                     'session.run waits this long between reading w and b and '
                     'computing the gradients.', lower_bound=0)
# ASYNC: several steps a session.run, for the benchmark; 1 is the book's.
flags.DEFINE_integer('steps_per_run', 1, 'Training steps per session.run, '
                     'each on its own batch.', lower_bound=1)


def model(x_p, partitioner=None):
    """The book's model, softmax regression: the logits of the ten classes
    for images x_p of 784 pixels; a partitioner, if any, splits w."""
    w = tf.get_variable('w', [mnist_data.IMAGE_PIXELS, mnist_data.NUM_CLASSES],
                        initializer=tf.random_normal_initializer(),
                        partitioner=partitioner)
    b = tf.get_variable('b', [mnist_data.NUM_CLASSES],
                        initializer=tf.random_normal_initializer())
    return tf.matmul(x_p, w) + b


def loss_and_accuracy(logits, y_p):
    """The book's loss, the mean cross-entropy of the logits against the
    one-hot labels y_p, and the share of them classified right."""
    cross_entropy = tf.nn.softmax_cross_entropy_with_logits_v2(
        labels=y_p, logits=logits)
    loss_op = tf.reduce_mean(cross_entropy)
    correct_pred = tf.equal(tf.argmax(logits, 1), tf.argmax(y_p, 1))
    accuracy_op = tf.reduce_mean(tf.cast(correct_pred, tf.float32))
    return loss_op, accuracy_op


def main(_):
    # PS: this task's place in the cluster, from --ps/--worker, TF_CONFIG
    # or Slurm; a failure, Ctrl-C, SIGTERM or a port in use ends it with one
    # line.
    task = cluster_utils.start_task(sync=False)
    tf.logging.set_verbosity(tf.logging.ERROR)
    tf.disable_v2_behavior()

    # PS: every task's address, by job; a ps only serves, until every worker
    # has come and gone.
    cluster = tf.train.ClusterSpec(task.cluster)
    if task.job_name == 'ps':
        server = tf.train.Server(cluster, job_name='ps',
                                 task_index=task.index, config=task.config)
        task.serve(server)  # it ends the task

    # ASYNC: each session.run takes --steps_per_run batches.
    images_per_run = FLAGS.batch_size * FLAGS.steps_per_run
    mnist = task.load_mnist(images_per_run)
    n_batches = len(mnist.train.images) // FLAGS.batch_size
    # ASYNC: global steps count every worker's steps; a resumed run ends
    # where the whole run would have.
    last_step = FLAGS.epochs * n_batches * cluster.num_tasks('worker')

    # PS: an evaluator measures the chief's checkpoints, outside the cluster.
    if task.job_name == 'evaluator':
        task.evaluate(model, loss_and_accuracy, mnist,
                      last_step)  # it ends the task

    # PS: a worker joins once its data and the chief's --logdir are good.
    task.check_logdir()
    server = tf.train.Server(cluster, job_name='worker',
                             task_index=task.index, config=task.config)
    is_chief = task.index == 0

    # PS: the variables go to the ps tasks, round robin, the computation to
    # this worker; with --split_w, w goes to them as a shard each.
    partitioner = (tf.fixed_size_partitioner(cluster.num_tasks('ps'))
                   if FLAGS.split_w else None)
    with tf.device(tf.train.replica_device_setter(
            worker_device='/job:worker/task:%d' % task.index,
            cluster=cluster)):
        # PS: each update adds one to the global step under its lock (a
        # resource variable's): two at once count two.
        with tf.variable_scope(tf.get_variable_scope(), use_resource=True):
            global_step = tf.train.get_or_create_global_step()

        x_p = tf.placeholder(tf.float32, [None, mnist_data.IMAGE_PIXELS])
        y_p = tf.placeholder(tf.float32, [None, mnist_data.NUM_CLASSES])
        loss_op, accuracy_op = loss_and_accuracy(model(x_p, partitioner),
                                                 y_p)
        optimizer = tf.train.GradientDescentOptimizer(FLAGS.learning_rate)
        # ASYNC: a straggler's gradients wait --step_delay_ms (None: the
        # book's); its staleness is read with w and b, below.
        slow, _ = cluster_utils.slow_gradients(FLAGS.step_delay_ms,
                                               global_step)
        train_op = optimizer.minimize(loss_op, global_step=global_step,
                                      grad_loss=slow)
        # ASYNC: K steps a session.run, built below.
        if FLAGS.steps_per_run > 1:
            train_op, loss_op = several_steps(optimizer, x_p, y_p,
                                              global_step, slow)
        # ASYNC: the global step as this worker reads w and b, and once its
        # update is applied: the others' updates between are its gradients'
        # staleness.
        steps = cluster_utils.global_steps_around(global_step, train_op)

    # PS: the chief initializes or restores the model and writes checkpoints
    # and summaries in --logdir, named relative to it so that a moved logdir
    # resumes; the others wait for the model, checking every second.
    sv = tf.train.Supervisor(is_chief=is_chief,
                             logdir=FLAGS.logdir,
                             init_op=tf.global_variables_initializer(),
                             global_step=global_step,
                             saver=tf.train.Saver(save_relative_paths=True),
                             recovery_wait_secs=1,
                             save_model_secs=0)

    # PS: sv.prepare_or_wait_for_session(server.target), in a session that
    # waits for a lost ps to come back and trains on; a worker that comes
    # after the run's last step ends here.
    sess = task.training_session(sv, server, last_step)

    rng = np.random.default_rng(task.index)
    gstep = sess.run(global_step)
    log = task.training_log(sv, sess, gstep, mnist, accuracy_op, x_p, y_p)
    lstep = 0
    # ASYNC: every worker its own epochs, its own steps; a resumed run ends
    # where it would have. An elastic run (--min_workers) ends there too,
    # at once: whoever came shares the listed workers' steps.
    for epoch in task.epochs(FLAGS.epochs):
        if gstep >= last_step:
            break
        for x_batch, y_batch in mnist_data.epoch_batches(
                mnist.train, images_per_run, rng):
            feed_dict = {x_p: x_batch, y_p: y_batch}
            (gstep_read, gstep), loss = sess.run(
                [steps, loss_op], feed_dict=feed_dict)
            lstep += FLAGS.steps_per_run
            log.step(gstep, lstep, loss,
                     gstep - gstep_read - FLAGS.steps_per_run)
            if task.elastic and gstep >= last_step:
                break
        if ((epoch + 1) % FLAGS.print_every_epochs == 0
                and not (task.elastic and gstep >= last_step)):
            print('worker=%d,epoch=%d,global_step=%d, local_step=%d, loss=%s'
                  % (task.index, epoch, gstep, lstep, loss), flush=True)
            log.accuracies(gstep)

    test = mnist_data.as_float(mnist.test)
    feed_dict = {x_p: test.images, y_p: test.labels}
    accuracy = sess.run(accuracy_op, feed_dict=feed_dict)
    print('worker=%d, final accuracy = %s' % (task.index, accuracy),
          flush=True)
    log.final(gstep, accuracy)
    # PS: the chief exports, once the others are done; closing tells the ps
    # this worker is done; TensorFlow cannot stop its server.
    task.export(sess, model, mnist)
    sess.close()
    task.leave()  # it ends the task


# ASYNC: K steps in one session.run.
def several_steps(optimizer, x_p, y_p, global_step, slow):
    """The train_op and loss_op of --steps_per_run steps in one session.run:
    the batches of all of them fed at once, the steps made one after the
    other, each reading w and b on the ps once the step before has updated
    them, their gradients starting from `slow`. It saves the dispatch and a
    round trip of all steps but one."""
    # w's shards (one, whole), in order, then b.
    *w_parts, b = tf.trainable_variables()
    train_op = None
    for k in range(FLAGS.steps_per_run):
        with tf.control_dependencies([train_op] if train_op else []):
            now = []
            for variable in w_parts + [b]:
                with tf.device(variable.device):
                    now.append(variable.read_value())
        w_now, b_now = tf.concat(now[:-1], 0), now[-1]
        rows = slice(k * FLAGS.batch_size, (k + 1) * FLAGS.batch_size)
        loss_op, _ = loss_and_accuracy(tf.matmul(x_p[rows], w_now) + b_now,
                                       y_p[rows])
        train_op = optimizer.minimize(loss_op, global_step=global_step,
                                      grad_loss=slow)
    return train_op, loss_op


if __name__ == '__main__':
    app.run(main, flags_parser=cluster_utils.parse_flags)
