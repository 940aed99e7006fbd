"""The same training with TF 2.x's ParameterServerStrategy, for bench.py.

The peer that a user who weighs moving to TF 2.x would pick: the same
softmax regression, batch, learning rate and data, trained by 1 or more ps
and N workers that only serve, and a coordinator (the `chief`) that
schedules --steps_per_function steps at a time onto whichever worker is
free, as TensorFlow's tutorial "Parameter server training with
ParameterServerStrategy" does it. Each step reads the current shared
variables and applies its own gradient to them, as the async script does.

    python -m bench.tf2_ps_strategy --job_name=ps --task_index=0 ...
    python -m bench.tf2_ps_strategy --job_name=worker --task_index=0 ...
    python -m bench.tf2_ps_strategy --job_name=chief ...   # trains, then prints

The ps and workers serve until they are killed; the chief prints one line
of figures and exits.
"""

import math
import os
import time

# TensorFlow prints pages of C++ start-up lines unless told before its import.
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from absl import app, flags  # noqa: E402

import mnist_data  # noqa: E402
from ps_cluster import exits  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_enum('job_name', None, ['ps', 'worker', 'chief'],
                  'Role of this task; the chief is the coordinator.')
flags.DEFINE_integer('task_index', 0, 'Index of this task within its job.')
flags.DEFINE_list('ps', ['localhost:9001'], 'host:port of the ps tasks.')
flags.DEFINE_list('worker', ['localhost:9002'], 'host:port of the workers.')
flags.DEFINE_string('chief', 'localhost:9000', 'host:port of the chief.')
flags.DEFINE_string('data_dir', mnist_data.DEFAULT_DIR, 'MNIST IDX files.')
flags.DEFINE_integer('validation_size', 5000, 'Held-out training images.')
flags.DEFINE_float('learning_rate', 0.01, 'Learning rate of gradient descent.')
flags.DEFINE_integer('batch_size', 100, 'Images per training step.')
flags.DEFINE_integer('epochs', 50,
                     'Steps in all: epochs x steps per epoch x workers, '
                     'as many as the async script makes.')
flags.DEFINE_integer('steps_per_function', 1,
                     'Training steps in each scheduled tf.function.')
flags.DEFINE_float('target_accuracy', 0.6,
                   'Test accuracy whose time of reaching is printed.')


def main(_):
    cluster = tf.train.ClusterSpec({'ps': FLAGS.ps, 'worker': FLAGS.worker,
                                    'chief': [FLAGS.chief]})
    if FLAGS.job_name != 'chief':
        tf.distribute.Server(cluster, job_name=FLAGS.job_name,
                             task_index=FLAGS.task_index, protocol='grpc',
                             start=True).join()

    mnist = mnist_data.read_data_sets(FLAGS.data_dir, FLAGS.validation_size)
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        cluster, task_type='chief', task_id=0, rpc_layer='grpc')
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)

    # The model's variables, on the ps.
    with strategy.scope():
        w = tf.Variable(tf.random.normal(
            [mnist_data.IMAGE_PIXELS, mnist_data.NUM_CLASSES]), name='w')
        b = tf.Variable(tf.random.normal([mnist_data.NUM_CLASSES]), name='b')

    # Each worker shuffles the training set each epoch, in its own pipeline;
    # uint8, as stored, keeps what is sent to the workers at a quarter of
    # float32.
    images, labels = mnist.train

    def dataset_fn():
        return (tf.data.Dataset.from_tensor_slices((images, labels))
                .shuffle(len(images)).repeat()
                .batch(FLAGS.batch_size, drop_remainder=True)
                .map(lambda x, y: (tf.cast(x, tf.float32) / 255,
                                   tf.one_hot(y, mnist_data.NUM_CLASSES)))
                .prefetch(tf.data.AUTOTUNE))

    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))

    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.nn.softmax_cross_entropy_with_logits(
                labels=y, logits=tf.matmul(x, w) + b))
        grad_w, grad_b = tape.gradient(loss, [w, b])
        w.assign_sub(FLAGS.learning_rate * grad_w)
        b.assign_sub(FLAGS.learning_rate * grad_b)
        return loss

    @tf.function
    def train_steps(iterator):
        loss = tf.constant(0.0)
        for _ in tf.range(FLAGS.steps_per_function):
            loss = strategy.run(step, args=next(iterator))
        return loss

    test = mnist_data.as_float(mnist.test)

    def test_accuracy():
        logits = test.images @ w.numpy() + b.numpy()
        return float(np.mean(np.argmax(logits, 1) == mnist.test.labels))

    # One epoch is a pass of every worker over the training set, as in the
    # async script; the test accuracy is taken after each.
    steps_per_epoch = len(images) // FLAGS.batch_size * len(FLAGS.worker)
    calls_per_epoch = math.ceil(steps_per_epoch / FLAGS.steps_per_function)
    # Tracing the function and building each worker's pipeline is not
    # training: one call per worker first, outside the time.
    started = time.time()
    for _ in FLAGS.worker:
        coordinator.schedule(train_steps, args=(iterator,))
    coordinator.join()
    training, reached = 0.0, None
    for _ in range(FLAGS.epochs):
        epoch_started = time.time()
        for _ in range(calls_per_epoch):
            coordinator.schedule(train_steps, args=(iterator,))
        coordinator.join()
        training += time.time() - epoch_started
        accuracy = test_accuracy()
        if reached is None and accuracy >= FLAGS.target_accuracy:
            reached = time.time()
    steps = FLAGS.epochs * calls_per_epoch * FLAGS.steps_per_function
    print('tf2: variables on %s; steps=%d, train_seconds=%.2f, '
          'steps_per_sec=%.1f, accuracy=%.4f, target_reached_at=%s, '
          'started_at=%.3f' % (w.device, steps, training, steps / training,
                               accuracy,
             'never' if reached is None else '%.3f' % reached, started),
          flush=True)
    # The coordinator's threads would wait for the workers: it ends the
    # process.
    exits.TaskEnd(lambda: 'chief').leave()


if __name__ == '__main__':
    app.run(main)
