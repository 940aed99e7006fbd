"""This task in TensorFlow 2's cluster, as a ps, worker or evaluator stands
on it: its place, its server's config, and the ps's and workers' end once
the coordinator has said its word."""

import os

import tensorflow as tf

import mnist_data
from ps_cluster.tf2 import coordinated, servers


class Tf2Task:
    """This task in TensorFlow 2's cluster, from `task` (the TF1 scripts'
    task in its role, whose settings it reads): worker 0 of that cluster is
    its chief, the coordinator (a Coordinator), and worker i its worker
    i - 1. `cluster` (a ClusterSpec), `job_name`, `index`, and
    `task_index`, its --task_index, which the lines it prints for
    launch_local.sh carry."""

    def __init__(self, task):
        self.task, self.end, self.settings = task, task.end, task.settings
        workers = task.cluster['worker']
        self.cluster = tf.train.ClusterSpec({
            'chief': workers[:1], 'worker': workers[1:],
            'ps': task.cluster['ps']})
        self.task_index = task.index
        if task.job_name in ('ps', 'evaluator'):
            self.job_name, self.index = task.job_name, task.index
        elif task.index == 0:
            self.job_name, self.index = 'chief', 0
        else:
            self.job_name, self.index = 'worker', task.index - 1
        self.name = '/job:%s/task:%d' % (self.job_name, self.index)
        # The TF1 config of its server, but TensorFlow 2's strategy filters
        # the devices itself, and, as its tutorial says, a server with fewer
        # inter-op threads than the workers and the coordinator never
        # finishes a step.
        self.config = tf.compat.v1.ConfigProto()
        self.config.CopyFrom(task.config)
        del self.config.device_filters[:]
        if self.config.inter_op_parallelism_threads:
            self.config.inter_op_parallelism_threads = max(
                self.config.inter_op_parallelism_threads, len(workers) + 1)
        task.end.name = lambda: self.name
        print('%s: TensorFlow 2\'s cluster: chief %s (the coordinator), '
              'workers %s, ps %s' % (
                  self.name, workers[0], ','.join(workers[1:]),
                  ','.join(task.cluster['ps'])), flush=True)
        # Only the coordinator can tell the others why it ends; TensorFlow
        # 2's servers cannot tell it.
        task.end.before_leaving(None)

    def load_mnist(self, images_per_step):
        """The data sets of data_dir (the TF1 task's load_mnist()), once
        the chief's logdir takes a file."""
        self.task.check_logdir()
        return self.task.load_mnist(images_per_step)

    def evaluate(self, model, mnist, last_step):
        """An evaluator beside the run, as the TF1 scripts' (their
        Evaluator's evaluate()): each new checkpoint of the coordinator's,
        in logdir/tf2, which a TF1 Saver restores by its variables' names,
        measured until the run's last. It ends the task."""
        def graph_model(images):
            return model(images, tf.compat.v1.get_variable(
                'w', [mnist_data.IMAGE_PIXELS, mnist_data.NUM_CLASSES]),
                tf.compat.v1.get_variable('b', [mnist_data.NUM_CLASSES]))
        self.task.evaluate(graph_model, loss_and_accuracy, mnist, last_step,
                           os.path.join(self.settings.logdir, 'tf2'))

    def serve(self, server):
        """server.join() for a ps or worker, but it ends once the
        coordinator has: with status 0 once it said why (one line if it did
        not finish), 1 if it stays silent for worker_timeout. It ends the
        task."""
        settings = self.settings
        self.task.gpu.check(server, self.task.config, self.job_name,
                            self.index)
        word = coordinated.Word(server, self.name)
        if self.job_name == 'ps':
            self.end.on_preemption(
                lambda: word.preempted(settings.preemption_grace),
                settings.preemption_grace)
        [coordinator] = servers.tasks(self.cluster, 'chief').items()
        word = word.wait(coordinator, settings.startup_timeout,
                         settings.worker_timeout,
                         servers.tasks(self.cluster, 'ps'))
        if word != coordinated.DONE:
            print('%s: the coordinator, %s (%s), left: "%s"' % (
                self.name, *coordinator, word), flush=True)
        self.end.leave()


def loss_and_accuracy(logits, labels):
    """The book's loss and accuracy, in a TF1 graph (an evaluator's), of
    the logits against one-hot labels."""
    loss = tf.reduce_mean(tf.nn.softmax_cross_entropy_with_logits(
        labels=labels, logits=logits))
    right = tf.equal(tf.argmax(logits, 1), tf.argmax(labels, 1))
    return loss, tf.reduce_mean(tf.cast(right, tf.float32))
