"""The cluster side of mnist_dist_tf2.py, on cluster_utils.py's flags and
task: TensorFlow 2's cluster, its servers' end, the coordinator's
checkpoints, summaries and SavedModel, and its waits for a lost ps.
TensorFlow 2 only: the TF1 scripts do not import it."""

import os
import sys
import time

import tensorflow as tf
from absl import flags

import cluster_utils
from ps_cluster import coordinated, errors, exits, probes
from ps_cluster.deadlines import call_within, poll
from ps_cluster.exits import TaskFailed

FLAGS = flags.FLAGS


def start_task():
    """This task (a Tf2Task) of TensorFlow 2's cluster, set to end in one
    line as the TF1 scripts' tasks are (cluster_utils.start_task())."""
    return Tf2Task(cluster_utils.start_task(sync=False))


class Tf2Task:
    """This task in TensorFlow 2's cluster: worker 0 of the TF1 scripts'
    cluster is its chief, the coordinator, and worker i its worker i - 1.
    `cluster` (a ClusterSpec), `job_name`, `index`, and `task_index`, its
    --task_index, which the lines it prints for launch_local.sh carry."""

    def __init__(self, task):
        self.task, self.end = task, task.end
        workers = task.cluster['worker']
        if task.job_name == 'evaluator':
            exits.usage_error('mnist_dist_tf2.py has no evaluator: its '
                              'coordinator measures the model each epoch')
        if len(workers) < 2:
            exits.usage_error('--worker lists %d task(s): TensorFlow 2 needs '
                              'a coordinator, worker 0, and a worker to '
                              'train' % len(workers))
        self.cluster = tf.train.ClusterSpec({
            'chief': workers[:1], 'worker': workers[1:],
            'ps': task.cluster['ps']})
        self.task_index = task.index
        if task.job_name == 'ps':
            self.job_name, self.index = 'ps', task.index
        elif task.index == 0:
            self.job_name, self.index = 'chief', 0
        else:
            self.job_name, self.index = 'worker', task.index - 1
        self.name = '/job:%s/task:%d' % (self.job_name, self.index)
        task.end.name = lambda: self.name
        print('%s: TensorFlow 2\'s cluster: chief %s (the coordinator), '
              'workers %s, ps %s' % (
                  self.name, workers[0], ','.join(workers[1:]),
                  ','.join(task.cluster['ps'])), flush=True)
        # Only the coordinator can tell the others why it ends; TensorFlow
        # 2's servers cannot tell it.
        task.end.before_leaving(self._tell_servers
                                if self.job_name == 'chief' else None)

    def load_mnist(self, images_per_step):
        """The data sets of --data_dir (cluster_utils.Task.load_mnist), once
        --logdir takes a file."""
        self.task.check_logdir()
        return self.task.load_mnist(images_per_step)

    def serve(self, server):
        """server.join() for a ps or worker, but it ends once the
        coordinator has: with status 0 once it said why (one line if it did
        not finish), 1 if it stays silent for --worker_timeout. It ends
        the task."""
        word = coordinated.Word(server, self.name).wait(
            self._coordinator(), FLAGS.startup_timeout, FLAGS.worker_timeout)
        if word != coordinated.DONE:
            print('%s: the coordinator, %s (%s), left: "%s"' % (
                self.name, *self._coordinator(), word), flush=True)
        self.end.leave()

    def wait_for_servers(self):
        """Until every ps and worker answers, or the end of this task after
        --startup_timeout: TensorFlow 2's strategy connects to them at once,
        and its first steps fail on a ps not yet up."""
        for job in ('ps', 'worker'):
            probes.wait_for_tasks(self.cluster, job, FLAGS.startup_timeout)
        poll(lambda: all(map(probes.answers, self.cluster.job_tasks('ps')
                             + self.cluster.job_tasks('worker'))),
             FLAGS.startup_timeout, 0.2)

    def checkpoints(self, **variables):
        """TensorFlow 2's checkpoints of variables in --logdir/tf2, from
        which a run with the same --logdir goes on; where there is none, a
        TF1 script's in --logdir, read by name, is restored instead (with
        any split of w). Returns a Checkpoints."""
        return Checkpoints(FLAGS.logdir, variables)

    def join(self, coordinator):
        """coordinator.join(), but a stall ends the task after
        --stall_timeout, naming the tasks that do not answer, and a lost ps
        is waited for, --ps_timeout, then the coordinator starts again from
        its last checkpoint: its variables there are lost, and TensorFlow
        2's coordinator cannot make them again."""
        try:
            call_within(FLAGS.stall_timeout, coordinator.join)
        except TimeoutError:
            raise TaskFailed('no step for %g s; %s' % (
                FLAGS.stall_timeout, self._silent() or 'every task answers'))
        except (tf.errors.UnavailableError, tf.errors.AbortedError,
                tf.errors.CancelledError) as e:
            lost = [name for name, address in self._tasks('ps').items()
                    if not probes.answers(address)]
            if not lost:
                raise TaskFailed(errors.what_went_wrong(e))
            self._start_again(lost[0])

    def log(self, start):
        """What the coordinator prints beyond the epoch lines, and writes in
        --logdir for TensorBoard."""
        return Log(self.task_index, start, FLAGS.logdir)

    def export(self, module, step, accuracy):
        """With --export_dir, writes `module` as a SavedModel in a folder
        named after the global step, and says its test accuracy."""
        if not FLAGS.export_dir:
            return
        path = os.path.join(FLAGS.export_dir, str(step))
        if tf.io.gfile.exists(path):
            raise TaskFailed('cannot export the model to %s: it exists'
                             % path)
        tf.saved_model.save(module, path,
                            signatures={'serving_default': module.serve})
        print('%s: exported the model at global_step=%d to %s; its test '
              'accuracy = %s' % (self.name, step, path, accuracy),
              flush=True)

    def leave(self):
        """Tells the ps tasks and workers the run is done, and ends this
        task, status 0."""
        self._tell_servers(coordinated.DONE)
        self.end.leave()

    def _coordinator(self):
        return '/job:chief/task:0', self.cluster.task_address('chief', 0)

    def _tasks(self, job):
        return {'/job:%s/task:%d' % (job, i): address for i, address in
                enumerate(self.cluster.job_tasks(job))}

    def _tell_servers(self, word):
        servers = {**self._tasks('ps'), **self._tasks('worker')}
        coordinated.tell(servers, word, exits.TaskEnd.LAST_WORDS_SECS)

    def _silent(self):
        silent = [name for job in ('ps', 'worker')
                  for name, address in self._tasks(job).items()
                  if not probes.answers(address)]
        return silent and '%s do(es) not answer' % ', '.join(silent)

    def _start_again(self, ps):
        """Waits for the lost ps, and starts this coordinator again, as a
        new process image with the same arguments, from its last checkpoint;
        or ends the task, saying why it cannot."""
        address = self._tasks('ps')[ps]
        if not FLAGS.logdir:
            raise TaskFailed('lost the connection to %s (%s), and with no '
                             '--logdir there is no checkpoint to start '
                             'again from' % (ps, address))
        print('%s: lost the connection to %s (%s): waiting up to %g s for '
              'it to come back (--ps_timeout)' % (
                  self.name, ps, address, FLAGS.ps_timeout), flush=True)
        if not poll(lambda: probes.answers(address), FLAGS.ps_timeout, 1):
            raise TaskFailed('lost the connection to %s (%s), which did not '
                             'come back within %g s' % (ps, address,
                                                        FLAGS.ps_timeout))
        print('%s: %s is back: starting again from the last checkpoint in '
              '%s' % (self.name, ps, FLAGS.logdir), flush=True)
        sys.stdout.flush()
        os.execv(sys.executable, [sys.executable] + sys.argv)


class Checkpoints:
    """The coordinator's checkpoints in logdir/tf2 (tf.train.Checkpoint and
    CheckpointManager), the variables restored from the last one, or from
    a TF1 run's in logdir; `source` says which, if any."""

    def __init__(self, logdir, variables):
        self.source = 'new variables'
        self.manager = None
        if not logdir:
            return
        checkpoint = tf.train.Checkpoint(**variables)
        self.manager = tf.train.CheckpointManager(
            checkpoint, os.path.join(logdir, 'tf2'), max_to_keep=5)
        tf1 = tf.train.latest_checkpoint(logdir)
        if self.manager.latest_checkpoint:
            checkpoint.restore(self.manager.latest_checkpoint).assert_consumed()
            self.source = 'the checkpoint %s' % self.manager.latest_checkpoint
        elif tf1:
            # Not tf.train.Checkpoint's name-based restore: it matches a
            # variable by its name in the graph, and a split w's shards are
            # w/part_0, ... there but one tensor w in a TF1 checkpoint.
            reader = tf.train.load_checkpoint(tf1)
            for name, variable in variables.items():
                variable.assign(reader.get_tensor(name))
            self.source = 'the TF1 checkpoint %s' % tf1

    def save(self, step):
        if self.manager:
            self.manager.save(checkpoint_number=step)


class Log:
    """The coordinator's lines of how long and fast it trained, and its
    summaries of loss and accuracy in logdir, for TensorBoard."""

    def __init__(self, task_index, start, logdir):
        self.index, self.start = task_index, start
        self.started = time.time()
        self.writer = logdir and tf.summary.create_file_writer(logdir)

    def epoch(self, step, **values):
        if self.writer:
            # The TF1 scripts' simple values, which TensorBoard reads
            # without its own package in this process.
            summary = tf.compat.v1.Summary(value=[
                tf.compat.v1.Summary.Value(tag=tag, simple_value=value)
                for tag, value in values.items()])
            with self.writer.as_default():
                tf.summary.experimental.write_raw_pb(
                    summary.SerializeToString(), step=step)
            self.writer.flush()

    def final(self, step, accuracy):
        seconds = time.time() - self.started
        print('worker=%d, local_steps=%d, global_step=%d, train_seconds=%.1f, '
              'steps_per_sec=%.1f' % (self.index, step - self.start, step,
                                      seconds, (step - self.start) / seconds),
              flush=True)
        self.epoch(step, test_accuracy=accuracy)
        if self.writer:
            self.writer.close()
