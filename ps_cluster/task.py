"""This task of the cluster, as every role stands on it: its place, the
config of its server and sessions, its GPU, how it ends, its data, and
the model it exports."""

import os

import tensorflow.compat.v1 as tf

import mnist_data
from ps_cluster import errors, exits, liveness, server, sources
from ps_cluster.exits import TaskFailed
from ps_cluster.export import export_saved_model
from ps_cluster.gpu import Gpu
from ps_cluster.logdir import Logdir
from ps_cluster.settings import (BATCH_SIZE, MIN_WORKERS, POOL_THREADS,
                                 REPLICAS_TO_AGGREGATE, STEPS_PER_RUN)


class Task:
    """This task of the cluster: its place (job_name, index, is_chief),
    every task's host:port by job (`cluster`, for tf.train.ClusterSpec),
    the `config` of its server and sessions, its `gpu` (a Gpu), the
    chief's `logdir`, how it ends (`end`, an exits.TaskEnd); a role (a
    Worker, Ps or Evaluator) adds the scripts' calls. `spec`, `job_name`,
    `index`: the cluster and this task's place in it, as `source` gave
    them; `settings`: its flags; `sync`: of mnist_dist_sync.py;
    `coordinator`: worker 0 coordinates and trains nothing, TF2's. One
    line says where the cluster came from, a second the size of its
    thread pools: pool_threads, or its share of the host's CPUs
    (TensorFlow's own take every CPU in every task, as if each had the
    host alone).
    """

    def __init__(self, settings, end, spec, job_name, index, source,
                 sync=False, coordinator=False):
        self.settings, self.sync, self.end = settings, sync, end
        self.job_name, self.index = job_name, index
        self.place = sources.Place(spec, job_name, index)
        self.name, self.is_chief = self.place.name, self.place.is_chief
        self.cluster = spec.as_dict()
        end.name = lambda: self.name
        self.address = (None if job_name == 'evaluator' else
                        spec.task_address(job_name, index))
        here = ('this task: %s' % self.address if self.address
                else 'this task follows its checkpoints')
        if source == 'Slurm':
            here += ' (Slurm task %s on %s)' % (
                os.environ['SLURM_PROCID'], os.environ.get('SLURMD_NODENAME'))
        print('%s: cluster from %s: ps %s, workers %s; %s'
              % (self.name, source, ','.join(spec.job_tasks('ps')),
                 ','.join(spec.job_tasks('worker')), here), flush=True)
        threads = 0
        if self.address:
            if settings.pool_threads:
                threads, why = settings.pool_threads, POOL_THREADS
            else:
                threads, why = server.cpu_share(self.cluster, self.address)
            inter = (' (%d inter-op: a long op leaves the others one)'
                     % server.WORKER_INTER_OP if job_name == 'worker'
                     and threads < server.WORKER_INTER_OP else '')
            print('%s: %d thread(s) a pool%s: %s' % (self.name, threads,
                                                     inter, why), flush=True)
            server.size_grpc_client(threads)
        self.gpu = Gpu(settings, self.place, self.address, coordinator)
        self.config = server.session_config(
            job_name, index, self.gpu.index, settings.gpu_memory_fraction,
            threads)
        # This worker's slot on the ps tasks, as it marks it.
        self.slot = liveness.Slot()
        self.min_workers = (settings.min_workers
                            or len(self.cluster['worker']))
        self.elastic = self.min_workers < len(self.cluster['worker'])
        self._check_min_workers(coordinator)
        # The chief's logdir: the others write nothing.
        self.logdir = (Logdir(settings.logdir, self.name,
                              settings.save_checkpoint_secs)
                       if self.is_chief and settings.logdir else None)

    def _check_min_workers(self, coordinator):
        """min_workers, if given, must be one a run can train with; else
        one line and exit status 2."""
        workers = len(self.cluster['worker'])
        if self.min_workers > workers:
            exits.usage_error('%s=%d, but the cluster lists %d workers'
                              % (MIN_WORKERS, self.min_workers, workers))
        if self.elastic and coordinator:
            exits.usage_error('%s: TensorFlow 2\'s coordinator connects to '
                              'every listed worker as it starts'
                              % MIN_WORKERS)
        aggregate = self.sync and (self.settings.replicas_to_aggregate
                                   or workers)
        if self.sync and self.min_workers < aggregate:
            exits.usage_error((
                '%s=%d is below the %d gradients each sync update '
                'aggregates (%s): with fewer workers an update would wait '
                'for good; backup workers, fewer to aggregate than workers, '
                'are the margin sync has' % (
                    MIN_WORKERS, self.min_workers, aggregate,
                    REPLICAS_TO_AGGREGATE))
                if self.settings.min_workers_given else (
                    '%s=%d is above the %d workers listed: each update '
                    'would wait for good' % (REPLICAS_TO_AGGREGATE,
                                             aggregate, workers)))

    def load_mnist(self, images_per_run):
        """The data sets of data_dir, or the end of this task saying why
        not. With shard_data, this worker's own slice of the training
        set."""
        settings = self.settings
        try:
            mnist = mnist_data.read_data_sets(
                settings.data_dir, settings.validation_size,
                settings.data_mirror)
        except mnist_data.DataError as e:
            raise TaskFailed(e)
        if settings.shard_data:
            num_workers = len(self.cluster['worker'])
            mnist = mnist._replace(train=mnist_data.Split(
                mnist.train.images[self.index::num_workers],
                mnist.train.labels[self.index::num_workers]))
        if len(mnist.train.images) < images_per_run:
            raise TaskFailed('%d training images are fewer than the %d of '
                             'one session.run (%s%s)'
                             % (len(mnist.train.images), images_per_run,
                                BATCH_SIZE, '' if self.sync else
                                ', times %s' % STEPS_PER_RUN))
        return mnist

    def check_logdir(self):
        """The chief's logdir, which it writes, must take a file: else one
        line and exit status 2 before it joins the cluster."""
        if self.logdir:
            self.logdir.check()
            self.logdir.forget_ended()

    def export_model(self, model, values, step, mnist):
        """With export_dir, the model, its variables set to values, as a
        SavedModel for serving in a folder named after step, with a line
        of its accuracy on mnist's test split. One writer per export: the
        chief and an evaluator may both have export_dir; the second to
        come finds the same model there."""
        if not self.settings.export_dir:
            return
        path = os.path.join(self.settings.export_dir, str(step))
        try:
            accuracy = export_saved_model(
                model, values, path, mnist_data.as_float(mnist.test),
                mnist_data.IMAGE_PIXELS)
        except ValueError as e:
            raise TaskFailed('cannot export the model to %s: %s' % (path, e))
        except (tf.errors.OpError, OSError) as e:
            raise TaskFailed('cannot export the model to %s (%s)'
                             % (path, errors.what_went_wrong(e)))
        if accuracy is None:
            print('%s: the model at global_step=%d is exported already, to %s'
                  % (self.name, step, path), flush=True)
        else:
            print('%s: exported the model at global_step=%d to %s; its test '
                  'accuracy = %s' % (self.name, step, path, accuracy),
                  flush=True)

    def leave(self):
        """Ends this task, status 0: TensorFlow cannot stop its server."""
        self.end.leave()
