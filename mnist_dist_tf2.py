"""MNIST softmax regression trained by parameter servers in TensorFlow 2:
the lesson of mnist_dist_async.py under tf.distribute's
ParameterServerStrategy, with a coordinator that schedules the steps onto
the workers (ClusterCoordinator). Each step reads w and b on the ps tasks
and applies its own gradients to them at once, as the async script's do.

It takes the TF1 scripts' cluster, --ps/--worker, TF_CONFIG or Slurm:
worker 0, their chief, is TensorFlow 2's chief, the coordinator, which
trains nothing itself; the other workers compute the steps. Pointed at a
--logdir of mnist_dist_async.py or mnist_dist_sync.py, it goes on from that
run's last checkpoint.

Start one process per task, for example on one machine:
    python mnist_dist_tf2.py --job_name=ps --task_index=0
    python mnist_dist_tf2.py --job_name=worker --task_index=0   # coordinator
    python mnist_dist_tf2.py --job_name=worker --task_index=1
    python mnist_dist_tf2.py --job_name=worker --task_index=2
--help lists every flag, the cluster's too.

A comment that starts with TF2: says why the block below it differs from
mnist_dist_async.py; docs/tensorflow-2.md puts the two side by side.
"""

import logging
import os

# TensorFlow's C++ logs pages at start-up, and on a machine without a GPU
# an ERROR line (cuInit failed) that reads as ours: FATAL only.
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
# TensorFlow 2.x imports Keras 3 as it starts, which this script does not
# use; with this it looks for Keras 2 (tf_keras) instead, and starts without.
os.environ.setdefault('TF_USE_LEGACY_KERAS', '1')

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from absl import app, flags, logging as absl_logging  # noqa: E402

import cluster_utils  # noqa: E402
import mnist_data  # noqa: E402
import tf2_utils  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_float('learning_rate', 0.01, 'Learning rate of gradient descent.')
flags.register_validator('learning_rate', lambda v: v > 0, 'must be positive')
flags.DEFINE_integer('epochs', 50, 'Passes of each worker of --worker over '
                     'the training set, as the async script counts them: the '
                     'run ends at the same global step.', lower_bound=1)
flags.DEFINE_integer('batch_size', 100, 'Images per training step.',
                     lower_bound=1)
flags.DEFINE_integer('print_every_epochs', 10, 'Print the loss every this '
                     'many epochs.', lower_bound=1)
# TF2: several steps a scheduled function, as the async script's several a
# session.run; 1 is the lesson's.
flags.DEFINE_integer('steps_per_run', 1, 'Training steps per scheduled '
                     'function, each on its own batch.', lower_bound=1)


def model(images, w, b):
    """The book's model, softmax regression: the logits of the ten classes
    for images of 784 pixels."""
    return tf.matmul(images, w) + b


def accuracy(logits, labels):
    """The share of labels (class numbers) the logits classify right."""
    return float(np.mean(np.argmax(logits, 1) == labels))


def main(_):
    # TF2: the TF1 scripts' cluster; their chief, worker 0, is TensorFlow
    # 2's chief, the coordinator; the other workers compute the steps.
    task = tf2_utils.start_task()
    cluster = task.cluster
    # The coordinator's own lines say what it does about a lost task.
    tf.get_logger().setLevel(logging.CRITICAL)
    absl_logging.set_verbosity(absl_logging.FATAL)

    # TF2: a ps or worker only serves; it ends once the coordinator has.
    if task.job_name in ('ps', 'worker'):
        server = tf.distribute.Server(cluster, job_name=task.job_name,
                                      task_index=task.index,
                                      config=task.config)
        task.serve(server)  # it ends the task

    mnist = task.load_mnist(FLAGS.batch_size)
    n_batches = len(mnist.train.images) // FLAGS.batch_size
    # The async script's global steps: each of --worker's workers walks each
    # epoch; the coordinator's share goes to the others.
    steps_per_epoch = n_batches * (cluster.num_tasks('worker') + 1)
    last_step = FLAGS.epochs * steps_per_epoch

    # TF2: an evaluator measures the coordinator's checkpoints, outside the
    # cluster.
    if task.job_name == 'evaluator':
        task.evaluate(model, mnist, last_step)  # it ends the task

    # TF2: the strategy finds the ps tasks and workers, and places each
    # variable made in its scope on a ps, round robin; with --split_w, w
    # goes to them as a shard each (b stays whole, as in the TF1 scripts).
    task.wait_for_servers()
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        cluster, task_type='chief', task_id=0, rpc_layer='grpc')

    def split_w(shape, dtype):  # called with both, by name
        return [cluster.num_tasks('ps'), 1] if shape.rank == 2 else [1]
    strategy = tf.distribute.ParameterServerStrategy(
        resolver, variable_partitioner=split_w if FLAGS.split_w else None)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        w = tf.Variable(tf.random.normal(
            [mnist_data.IMAGE_PIXELS, mnist_data.NUM_CLASSES]), name='w')
        b = tf.Variable(tf.random.normal([mnist_data.NUM_CLASSES]), name='b')
        global_step = tf.Variable(0, dtype=tf.int64, name='global_step',
                                  trainable=False)

    # TF2: this run's checkpoints, or a TF1 run's, in --logdir.
    checkpoints = task.checkpoints(w=w, b=b, global_step=global_step)
    test = mnist_data.as_float(mnist.test)
    validation = mnist_data.as_float(mnist.validation)
    start = int(global_step.numpy())
    print('worker=%d, starting at global_step=%d from %s; test accuracy = %s'
          % (task.task_index, start, checkpoints.source,
             accuracy(model(test.images, w, b), mnist.test.labels)),
          flush=True)

    # TF2: each worker shuffles the training set each epoch, in a pipeline
    # of its own that the coordinator makes there.
    images, labels = mnist.train

    def dataset_fn():
        return (tf.data.Dataset.from_tensor_slices((images, labels))
                .shuffle(len(images)).repeat()
                .batch(FLAGS.batch_size, drop_remainder=True)
                .map(lambda x, y: (tf.cast(x, tf.float32) / 255,
                                   tf.one_hot(y, mnist_data.NUM_CLASSES))))

    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))

    # TF2: one step, run by the strategy on a worker's device: it reads w
    # and b, and applies its gradients to them on the ps, shard by shard (a
    # split w's are its .variables; one ps keeps it whole).
    params = list(getattr(w, 'variables', [w])) + [b]

    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.nn.softmax_cross_entropy_with_logits(
                labels=y, logits=model(x, w, b)))
        for param, grad in zip(params, tape.gradient(loss, params)):
            param.assign_sub(FLAGS.learning_rate * grad)
        global_step.assign_add(1)
        return loss

    # TF2: --steps_per_run steps in one function, scheduled on whichever
    # worker is free.
    @tf.function
    def train_steps(iterator):
        loss = tf.constant(0.0)
        for _ in tf.range(FLAGS.steps_per_run):
            loss = strategy.run(train_step, args=next(iterator))
        return loss

    log = task.log(start, steps_per_epoch)
    step = start
    while step < last_step:
        epoch = step // steps_per_epoch
        end = min(last_step, (epoch + 1) * steps_per_epoch)
        # TF2: the steps are scheduled, not run: join() waits for them.
        losses = [coordinator.schedule(train_steps, args=(iterator,))
                  for _ in range(-(-(end - step) // FLAGS.steps_per_run))]
        task.join(coordinator)
        # TF2: reads of the ps, each within --stall_timeout: a frozen ps
        # would block them for good. A step run again may pass `end`.
        step, loss, validation_accuracy, test_accuracy = task.within(
            lambda: (int(global_step.numpy()), losses[-1].fetch(),
                     accuracy(model(validation.images, w, b),
                              mnist.validation.labels),
                     accuracy(model(test.images, w, b), mnist.test.labels)))
        if (epoch + 1) % FLAGS.print_every_epochs == 0:
            print('worker=%d,epoch=%d,global_step=%d, local_step=%d, loss=%s'
                  % (task.task_index, epoch, step, step - start, loss),
                  flush=True)
        log.epoch(step, loss=loss, validation_accuracy=validation_accuracy,
                  test_accuracy=test_accuracy)
        task.within(checkpoints.save)

    final = task.within(lambda: accuracy(model(test.images, w, b),
                                         mnist.test.labels))
    print('worker=%d, final accuracy = %s' % (task.task_index, final),
          flush=True)
    log.final(step, final)
    # TF2: a SavedModel of the trained values, with the TF1 export's
    # signature; the ps tasks and workers are told to leave.
    task.within(task.export, Serving(w, b, global_step), step, final)
    task.leave()  # it ends the task


class Serving(tf.Module):
    """The trained model for TensorFlow Serving: copies of the values of w,
    b and the global step, and the TF1 export's signature, from float32
    images to class probabilities and the predicted class."""

    def __init__(self, w, b, global_step):
        super().__init__()
        self.w = tf.Variable(tf.convert_to_tensor(w), name='w')
        self.b = tf.Variable(b.read_value(), name='b')
        self.global_step = tf.Variable(global_step.read_value(),
                                       name='global_step')

    @tf.function(input_signature=[tf.TensorSpec(
        [None, mnist_data.IMAGE_PIXELS], tf.float32, name='images')])
    def serve(self, images):
        logits = model(images, self.w, self.b)
        return {'probabilities': tf.nn.softmax(logits),
                'classes': tf.argmax(logits, 1)}


if __name__ == '__main__':
    app.run(main, flags_parser=cluster_utils.parse_flags)
