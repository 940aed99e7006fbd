"""MNIST softmax regression trained by parameter servers, synchronously:
the gradients of --replicas_to_aggregate workers are averaged into one
update of the shared variables, and the workers wait for it. The script of
Mastering TensorFlow 1.x, chapter 15.

The ps tasks hold the variables, w and b, and serve them. Each worker reads
them, computes the gradient of its own batch, and sends it to the ps to be
applied. Worker 0, the chief, also initializes the variables, or restores
them from a checkpoint, and writes checkpoints and summaries.

Start one process per task, for example on one machine:
    python mnist_dist_sync.py --job_name=ps --task_index=0
    python mnist_dist_sync.py --job_name=worker --task_index=0   # the chief
    python mnist_dist_sync.py --job_name=worker --task_index=1
    python mnist_dist_sync.py --job_name=worker --task_index=2
The cluster's flags (--ps, --worker, --logdir...) are in cluster_utils.py.

A marker at the end of a statement's first line labels the statement, and
a comment above it that starts with the marker says more: # PS: it makes
the program distributed; # ASYNC: or # SYNC: it differs from
mnist_dist_async.py; # BOOK: it stands for a line of the book's script,
quoted, and says why. Skip the # BOOK: statements and the rest is the
book's script, in its order (docs/book.md).
"""

import itertools  # SYNC: for epoch in itertools.count()
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
flags.DEFINE_integer(  # SYNC: fewer than the workers: backup workers
    'replicas_to_aggregate', None, 'Gradients per update (default: all the '
    'workers).', lower_bound=1)


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
    # train never joins. SYNC: the wrapped optimizer serves one step a run.
    images_per_run = FLAGS.batch_size  # SYNC:
    mnist = cluster_utils.load_mnist(cluster, images_per_run)  # BOOK:
    server = cluster_utils.start_server(cluster)  # PS: BOOK: tf.train.Server

    if FLAGS.job_name == 'ps':  # PS:
        # BOOK: server.join(), which never returns; this ends the ps once
        # every worker has come and gone.
        cluster_utils.join(server, cluster)  # PS: BOOK:

    n_batches = len(mnist.train.images) // FLAGS.batch_size
    is_chief = FLAGS.task_index == 0  # PS: it initializes, saves, restores
    # SYNC: every worker stops at the same global step, not after its own
    # epochs: one that left early would leave the others waiting for its
    # gradients forever. Each update takes a step of every worker.
    last_step = FLAGS.epochs * n_batches  # SYNC:

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
        # SYNC: the book's wrapped optimizer; its accumulators and token
        # queue live on the ps tasks.
        num_workers = cluster.num_tasks('worker')  # SYNC:
        optimizer = tf.train.SyncReplicasOptimizer(  # PS: SYNC:
            optimizer,
            replicas_to_aggregate=FLAGS.replicas_to_aggregate or num_workers,
            total_num_replicas=num_workers)
        train_op = optimizer.minimize(loss_op, global_step=global_step)

        # SYNC: once the shared variables are initialized, the chief sets up
        # the gradient accumulators, each other worker its local step.
        if is_chief:  # SYNC:
            local_init_op = optimizer.chief_init_op
        else:  # SYNC:
            local_init_op = optimizer.local_step_init_op
        # SYNC: BOOK: chief_queue_runner = optimizer.get_chief_queue_runner()
        # and init_token_op = optimizer.get_init_tokens_op(); and the tokens
        # that free a worker waiting for one after a worker or a ps is lost.
        tokens = cluster_utils.sync_tokens(  # PS: SYNC: BOOK:
            optimizer, cluster, global_step, last_step)
        # SYNC: the global step once this worker's step is over, read on the
        # ps after the token that freed it was taken; the token's own value,
        # and a read beside the step, may lag one update behind, and a
        # worker that missed the last update would wait for the next forever.
        with tf.device(global_step.device):  # SYNC:
            with tf.control_dependencies([train_op]):
                step_after = global_step.read_value()

        correct_pred = tf.equal(tf.argmax(logits, 1), tf.argmax(y_p, 1))
        accuracy_op = tf.reduce_mean(tf.cast(correct_pred, tf.float32))

    # PS: the chief writes checkpoints and summaries in --logdir, from the
    # session below (a failed save would stop the Supervisor's own), named
    # relative to it, so a copied or moved logdir resumes from its own; the
    # others check for the model every second, not every 30.
    sv = tf.train.Supervisor(is_chief=is_chief,  # PS:
                             logdir=FLAGS.logdir,
                             init_op=tf.global_variables_initializer(),
                             local_init_op=local_init_op,  # SYNC:
                             ready_for_local_init_op=(  # SYNC:
                                 optimizer.ready_for_local_init_op),
                             global_step=global_step,
                             saver=tf.train.Saver(save_relative_paths=True),
                             recovery_wait_secs=1,
                             save_model_secs=0)

    # BOOK: with sv.prepare_or_wait_for_session(server.target) as mts:
    # a session that outlives a lost ps. SYNC: with the tokens.
    sess = cluster_utils.training_session(  # PS: SYNC: BOOK:
        sv, server, cluster, tokens)
    # SYNC: BOOK: if is_chief: mts.run(init_token_op) and
    # sv.start_queue_runners(mts, [chief_queue_runner]): the chief applies
    # the updates; in each new session after a lost ps too.
    if is_chief:  # SYNC:
        tokens.start_updates(sv, sess)  # SYNC: BOOK:

    rng = np.random.default_rng(FLAGS.task_index)  # BOOK: next_batch's order
    gstep = sess.run(global_step)  # PS: where a resumed run starts
    log = cluster_utils.training_log(  # PS: pace, totals and TensorBoard
        sv, sess, gstep, mnist, accuracy_op, x_p, y_p)
    lstep = 0
    for epoch in itertools.count():  # SYNC: until the last global step
        if gstep >= last_step:  # SYNC: a latecomer may find it done
            break
        for x_batch, y_batch in mnist_data.epoch_batches(  # BOOK: next_batch
                mnist.train, images_per_run, rng):
            feed_dict = {x_p: x_batch, y_p: y_batch}
            gstep, loss = sess.run(  # SYNC: the step after the update
                [step_after, loss_op], feed_dict=feed_dict)
            lstep += 1  # SYNC: the book's line
            log.step(gstep, lstep, loss)  # PS:
            time.sleep(FLAGS.step_delay_ms / 1000)  # PS: a straggler
            if gstep >= last_step:  # SYNC: the workers stop together
                break
        if ((epoch + 1) % FLAGS.print_every_epochs == 0  # SYNC: whole epochs
                and gstep < last_step):
            print('worker=%d,epoch=%d,global_step=%d, local_step=%d, loss=%s'
                  % (FLAGS.task_index, epoch, gstep, lstep, loss), flush=True)
            log.accuracies(gstep)  # PS:
    tokens.release(sess)  # SYNC: for any other worker still waiting
    feed_dict = {x_p: mnist.test.images, y_p: mnist.test.labels}
    accuracy = sess.run(accuracy_op, feed_dict=feed_dict)
    print('worker=%d, final accuracy = %s' % (FLAGS.task_index, accuracy),
          flush=True)
    log.final(gstep, accuracy)  # PS:
    cluster_utils.export(sess, model, mnist)  # PS: --export_dir, the chief
    sess.close()  # BOOK: the with block's end; it tells the ps it is done
    cluster_utils.leave()  # PS: at once: TensorFlow cannot stop its server


if __name__ == '__main__':
    app.run(main, flags_parser=cluster_utils.parse_flags)  # BOOK: tf.app.run()
