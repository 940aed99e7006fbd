"""MNIST softmax regression, trained by parameter servers with synchronous
updates: the gradients of --replicas_to_aggregate workers are averaged into
one update of the shared variables, and the workers wait for it.

The ps tasks hold the variables and serve them; each worker reads them,
computes the gradient of its own batch, and sends it back to be applied.
Worker 0, the chief, also initializes the variables (or restores them from a
checkpoint) and writes checkpoints and summaries.

Start one process per task, for example on one machine:
    python mnist_dist_sync.py --job_name=ps --task_index=0
    python mnist_dist_sync.py --job_name=worker --task_index=0   # the chief
    python mnist_dist_sync.py --job_name=worker --task_index=1
    python mnist_dist_sync.py --job_name=worker --task_index=2
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
# SYNC: fewer than the workers leaves the slowest as backup workers.
flags.DEFINE_integer('replicas_to_aggregate', None,
                     'Gradients per update (default: all the workers).',
                     lower_bound=1)


def main(_):
    cluster_utils.exit_on_signals()
    tf.logging.set_verbosity(tf.logging.ERROR)  # else the next line warns
    tf.disable_v2_behavior()  # graphs and sessions, as in TensorFlow 1.x
    cluster = cluster_utils.cluster_spec_from_flags()
    server = cluster_utils.start_server(cluster)

    if FLAGS.job_name == 'ps':
        liveness.serve_until_workers_gone(server, cluster)
        cluster_utils.leave()

    steps_per_run = 1  # SYNC: as below
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

        # SYNC: one step per session.run, as in the book: the wrapped
        # optimizer's queue runner and init ops serve only the last update
        # it makes in a graph, and each step waits for the other workers.
        loss = tf.reduce_mean(tf.nn.softmax_cross_entropy_with_logits_v2(
            labels=y_, logits=logits))
        # SYNC: wrap the optimizer; its accumulators and token queue live on
        # the ps tasks.
        num_workers = cluster.num_tasks('worker')
        replicas = FLAGS.replicas_to_aggregate or num_workers
        opt = tf.train.SyncReplicasOptimizer(
            opt, replicas_to_aggregate=replicas,
            total_num_replicas=num_workers)
        train_op = opt.minimize(loss, global_step=global_step)

        # SYNC: the global step once this worker's step is over, read on the
        # ps after the token that freed it was taken; the token's own value,
        # and a read beside the step, may lag one update behind, and a worker
        # that missed the last update would wait for the next forever.
        with tf.device(global_step.device), \
                tf.control_dependencies([train_op]):
            step_after = global_step.read_value()

    # SYNC: once the shared variables are initialized, the chief sets up the
    # gradient accumulators, each other worker its local step.
    local_init_op = opt.chief_init_op if is_chief else opt.local_step_init_op
    chief_queue_runner = opt.get_chief_queue_runner()
    init_tokens_op = opt.get_init_tokens_op()
    # SYNC: tokens a worker leaves when done, for any other still waiting.
    release_tokens_op = opt.get_init_tokens_op(num_tokens=num_workers)

    # SYNC: every worker stops at the same global step, not after its own
    # epochs: one that left early would leave the others waiting for its
    # gradients forever. Each update takes one step of every worker, so
    # that is about --epochs passes of each over the training set.
    last_step = FLAGS.epochs * (len(mnist.train.images) // FLAGS.batch_size)

    # SYNC: a worker that dies while it waits for a token takes one with it,
    # and the others would wait forever for the gradient it owed: the chief
    # puts one back. One that left at the last step is done, not gone.
    add_token_op = opt.get_init_tokens_op(num_tokens=1)

    def worker_gone(sess):
        if sess.run(global_step) >= last_step:
            return False
        if is_chief:
            sess.run(add_token_op)
        return True

    # SYNC: a lost ps stops the chief's updates, and a worker may wait for
    # a token, on a ps that stayed, that no update will give: each worker
    # puts them in (one each poll of its Watchdog) until it is freed, to
    # meet the lost ps at its next step.
    def ps_lost(sess):
        sess.run(add_token_op)

    # SYNC: the chief's queue runner applies the aggregated gradients. Run
    # in a loop of the Supervisor's: as a QueueRunner it would close the
    # token queue whenever it stops, a lost ps too, and then no worker could
    # take a token again.
    def start_updates(sess):
        sv.loop(None, sess.run, args=(chief_queue_runner.enqueue_ops,))
        sess.run(init_tokens_op)

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
        local_init_op=local_init_op,
        ready_for_local_init_op=opt.ready_for_local_init_op,
        recovery_wait_secs=1,
        save_model_secs=0)
    sess = training_session.RecoverableSession(sv, server, cluster,
                                               on_worker_gone=worker_gone,
                                               on_ps_lost=ps_lost)

    def accuracy_on(split):
        return float(sess.run(accuracy, {x: split.images, y_: split.labels}))

    rng = np.random.default_rng(FLAGS.task_index)
    step = sess.run(global_step)  # SYNC: a latecomer may find it done
    log = cluster_utils.TrainingLog(sv, sess, step, accuracy_on, mnist)
    # SYNC: the chief starts applying updates, and puts in the tokens that
    # let the first step complete; only now, so that no update can come
    # before the step it logged; and again in each new session after a lost
    # ps.
    if is_chief:
        sess.on_each_session(start_updates)
    epoch = 0
    while step < last_step:
        for batch_x, batch_y in mnist_data.epoch_batches(
                mnist.train, FLAGS.batch_size * steps_per_run, rng):
            step, loss_value = sess.run(
                [step_after, loss],
                feed_dict={x: batch_x, y_: batch_y})
            log.step(step, loss_value, steps_per_run)
            if FLAGS.step_delay_ms:
                time.sleep(FLAGS.step_delay_ms / 1000)
            if step >= last_step:
                break
        else:  # a whole epoch
            log.epoch(epoch, step, loss_value)
        epoch += 1
    sess.run(release_tokens_op)
    final_accuracy = accuracy_on(mnist.test)
    print('worker=%d, final accuracy = %s'
          % (FLAGS.task_index, final_accuracy), flush=True)
    log.final(step, final_accuracy)
    sess.close()
    cluster_utils.leave()


if __name__ == '__main__':
    app.run(main, flags_parser=cluster_utils.parse_flags)
