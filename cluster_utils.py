"""The cluster side of mnist_dist_async.py and mnist_dist_sync.py: the
cluster's flags, and this task (start_task()), whose calls stand in for a
line of the book's script or add what a real cluster needs, on ps_cluster/
beneath, which reads no flag. Importing it only defines flags: the scripts
set TensorFlow up themselves.
"""

import collections
import itertools
import os
import sys
import threading
import time
import traceback

import numpy as np
import tensorflow.compat.v1 as tf
from absl import flags

import mnist_data
from ps_cluster import errors, exits, liveness, probes, server, sources
from ps_cluster.evaluator import evaluator
from ps_cluster.worker import placement
from ps_cluster.deadlines import Outage, poll
from ps_cluster.exits import TaskFailed
from ps_cluster.export import export_saved_model
from ps_cluster.logdir import CHIEF_DONE, CHIEF_LEFT, Logdir, marker
from ps_cluster.ps.ps_task import STARTUP_GRACE_SECS, PsTask
from ps_cluster.worker.recoverable_session import RecoverableSession
from ps_cluster.worker.session_start import SessionCreator
from ps_cluster.worker.stall_watch import StallWatch
from ps_cluster.worker.staleness import Staleness, global_step_copy
# The scripts' own calls: copies of the steps that measure staleness.
from ps_cluster.worker.staleness import (  # noqa: F401
    global_steps_around, local_step_copy)
from ps_cluster.worker.sync_tokens import SyncTokens
from ps_cluster.worker.training_log import TrainingLog

FLAGS = flags.FLAGS

flags.DEFINE_enum('job_name', None, ['ps', 'worker', 'evaluator'],
                  'Role of this task. An evaluator is no task of the '
                  'cluster: it follows the chief\'s checkpoints in --logdir.')
flags.DEFINE_integer('task_index', 0, 'Index of this task within its job.',
                     lower_bound=0)
flags.DEFINE_string('ps', 'localhost:9001',
                    'Comma-separated host:port list of the ps tasks. Without '
                    '--ps and --worker the cluster comes from TF_CONFIG, '
                    'else from Slurm under srun, else from their defaults.')
flags.DEFINE_string('worker', 'localhost:9002,localhost:9003,localhost:9004',
                    'Comma-separated host:port list of the worker tasks.')
flags.DEFINE_integer('num_ps', 1, 'Under srun: how many of its tasks are ps '
                     'tasks (the first ones).', lower_bound=1)
flags.DEFINE_integer('slurm_port_base', 8888,
                     'Under srun: the port of the first task on each node.',
                     lower_bound=1)
flags.DEFINE_boolean('slurm_evaluator', False,
                     'Under srun: the last of its tasks is an evaluator, '
                     'which then exports (--export_dir) in the chief\'s '
                     'place.')
flags.DEFINE_string('data_dir', mnist_data.DEFAULT_DIR,
                    'Directory with the four MNIST IDX .gz files; missing '
                    'ones are downloaded into it.')
flags.DEFINE_string('data_mirror', None,
                    'URL of a directory with the four MNIST files, used '
                    'instead of the public mirrors (an internal mirror, for '
                    'clusters without internet access); files from it are '
                    'SHA-256 checked too.')
flags.DEFINE_bool('shard_data', False,
                  'Each worker walks its own 1/N of the training set each '
                  'epoch, instead of all of it as in the book.')
flags.DEFINE_bool('split_w', False,
                  'Split w into a shard per ps task, so that each holds a '
                  'near-equal share of the model, instead of round robin '
                  'placing it whole on one ps as in the book.')
flags.DEFINE_integer('validation_size', 5000,
                     'Training images held out for validation.', lower_bound=0)
flags.DEFINE_integer('pool_threads', 0,
                     'Threads in each of this task\'s thread pools: '
                     'TensorFlow\'s intra-op and inter-op pools (a '
                     'worker\'s inter-op pool at least 2), and its gRPC '
                     'client\'s. 0: its share of the CPUs it may use (its '
                     'affinity, its cgroup\'s quota), divided among the '
                     'cluster\'s tasks on its host.', lower_bound=0)
flags.DEFINE_list('gpu_jobs', ['worker'],
                  'The tasks that use a GPU, by job: worker, ps, evaluator, '
                  'coordinator (mnist_dist_tf2.py\'s worker 0); empty '
                  '(--gpu_jobs=): none. Each uses one of the GPUs it sees '
                  '(CUDA_VISIBLE_DEVICES, as a scheduler sets it), dealt out '
                  'round robin by its rank among the tasks on its host that '
                  'use one.')
flags.DEFINE_float('gpu_memory_fraction', None,
                   'At most this share of its GPU\'s memory for each task '
                   'that uses one (the book\'s 0.2 fits four on one GPU); '
                   'without it, a task takes what it needs.')
flags.DEFINE_string('logdir', None,
                    'Where the chief writes summaries for TensorBoard and '
                    'checkpoints, and each worker its staleness; a run with '
                    'the same logdir resumes from the last checkpoint. '
                    'Nothing is written without it.')
flags.DEFINE_float('save_checkpoint_secs', 60,
                   'Seconds between the chief\'s checkpoints in --logdir.')
flags.DEFINE_integer('min_workers', None,
                     'Async: the workers, the chief among them, with which '
                     'the run may train (default: every worker listed). The '
                     'others may come later or never, and any but the chief '
                     'may leave (SIGTERM: a scale-down); fewer for '
                     '--startup_timeout end the run. Sync takes no fewer '
                     'than it aggregates.', lower_bound=1)
flags.DEFINE_float('startup_timeout', 120,
                   'Seconds to wait for the other tasks to come up.')
flags.DEFINE_float('ps_timeout', 120,
                   'Seconds a worker waits for a ps task it lost to come '
                   'back (a restarted pod or requeued task) before it gives '
                   'up.')
flags.DEFINE_float('stall_timeout', 180,
                   'Seconds without a new global step after which every '
                   'worker gives up, naming the workers that are gone or '
                   'the ps task that does not answer, whatever it waits in; '
                   'and the longest one session.run of a worker may take '
                   'while the others\' steps go on: a worker slower than '
                   'that gets a new session once, then ends.')
flags.DEFINE_float('worker_timeout', 120,
                   'Seconds a ps waits for workers that fell silent (a '
                   'network cut, a rebooting node) before it leaves a run '
                   'that every other worker has left. mnist_dist_tf2.py: '
                   'seconds a ps or worker waits for a coordinator that fell '
                   'silent before it exits 1.')
flags.DEFINE_float('preemption_grace', 20,
                   'Seconds a task given SIGTERM (a scheduler preempting it) '
                   'takes to save what would be lost: the chief saves the '
                   'model, a ps waits for the chief\'s save; below '
                   'Kubernetes\' terminationGracePeriodSeconds and Slurm\'s '
                   'KillWait (30 s by default).')
flags.DEFINE_string('export_dir', None,
                    'Where the chief, once training ends, or an evaluator, '
                    'once it has measured the last checkpoint, writes a '
                    'SavedModel for serving, in a folder named after the '
                    'global step (TensorFlow Serving\'s versions).')
flags.DEFINE_enum('eval_split', 'test', ['test', 'validation'],
                  'The split an evaluator measures each checkpoint on.')
flags.DEFINE_float('eval_timeout', 300,
                   'Seconds an evaluator waits for a new checkpoint once '
                   'the chief no longer answers, before it gives up.')
flags.DEFINE_bool('tracebacks', False,
                  'Print the traceback of an error a task ends with, or a '
                  'thread fails with, above its one line: for reporting a '
                  'bug.')
for _name in ('eval_timeout', 'stall_timeout', 'startup_timeout', 'ps_timeout',
              'worker_timeout', 'save_checkpoint_secs', 'preemption_grace'):
    flags.register_validator(_name, lambda v: v > 0, 'must be positive')
flags.register_validator('gpu_memory_fraction',
                         lambda v: v is None or 0 < v <= 1,
                         'must be in (0, 1]')
GPU_JOBS = ('worker', 'ps', 'evaluator', 'coordinator')
flags.register_validator('gpu_jobs', lambda v: set(v) <= set(GPU_JOBS),
                         'must name jobs of %s' % ', '.join(GPU_JOBS))


def parse_flags(argv):
    """absl's parser, but --help lists the cluster's flags too and exits 0,
    a usage error is one line and exit status 2; and ~ at the start of
    --data_dir or --logdir is the home directory, as in a shell, which does
    not expand it after '='."""
    if {'-h', '--help', '-help', '--helpshort'} & set(argv[1:]):
        script = sys.modules['__main__']
        print('%s\n\n%s\n\n%s' % (script.__doc__.strip(),
                                     FLAGS.module_help(argv[0]),
                                     FLAGS.module_help(__name__)))
        sys.exit(0)  # it ends the task
    try:
        argv = FLAGS(argv)
    except flags.Error as e:
        exits.usage_error(e)
    for name in ('data_dir', 'logdir'):
        if FLAGS[name].value:
            FLAGS[name].value = os.path.expanduser(FLAGS[name].value)
    return argv


def start_task(sync, coordinator=False):
    """This task (a Task; `sync`: of mnist_dist_sync.py; `coordinator`:
    worker 0 coordinates and trains nothing, TF2's), set to end in one
    line: Ctrl-C and SIGTERM at once, inside sess.run too, the cluster told
    why after Ctrl-C; a failure of ours (TaskFailed), a port in use, and
    any other error as the main thread raises it, and a thread's that no
    coordinator stores."""
    end = exits.TaskEnd(lambda: '/job:%s/task:%d' % (FLAGS.job_name,
                                                    FLAGS.task_index))
    end.on_signals()
    task = Task(sync, end, coordinator)

    def one_line(kind, error, trace):
        if FLAGS.tracebacks:
            traceback.print_exception(kind, error, trace)
        if issubclass(kind, TaskFailed):
            task.end.fail(error.message, error.status)  # it ends the task
        if kind is tf.errors.UnknownError and (
                'Could not start gRPC server' in error.message):
            task.end.fail('cannot listen on port %s (%s): is it in use?' % (
                task.address.rpartition(':')[2], task.address))
        if issubclass(kind, tf.errors.OpError):
            task.end.fail(task.gpu_line(error)
                          or errors.what_went_wrong(error))
        # Any other, a line too: TensorFlow raises more than its own.
        task.end.fail('%s: %s' % (kind.__name__, error))
    sys.excepthook = one_line

    def thread_failed(args):
        if FLAGS.tracebacks:
            traceback.print_exception(args.exc_type, args.exc_value,
                                      args.exc_traceback)
        # Not stored: summaries lost cost the summaries, not the run. It is
        # TensorFlow's thread that writes them, which ends at the first
        # write that fails, and TrainingLog writes no more.
        if type(args.thread).__name__ == '_EventLoggerThread':
            Logdir(FLAGS.logdir, task.name).failed('write summaries',
                                                   args.exc_value)
        # Nor TensorFlow's own, closing a session left on an error, whose
        # task may be gone: the error was the one to say. Any other ends
        # the task: the sessions' threads store what they meet, and a
        # thread that fails is one the task cannot go on without.
        elif args.thread.name != 'SessionCloseThread':
            task.end.fail('%s failed: %s' % (args.thread.name,
                                             args.exc_value))
    threading.excepthook = thread_failed

    def collected(args):
        # TensorFlow's objects raise a lost task's error again as they are
        # collected (TF2's eager executor waits for its ops as it goes):
        # the task's own line says what went wrong, once. Another is one
        # line: it ends nothing.
        if not errors.is_ps_failure(args.exc_value):
            print('%s: ignored in %s: %s' % (
                task.name, getattr(args.object, '__qualname__', args.object),
                args.exc_value), file=sys.stderr, flush=True)
    sys.unraisablehook = collected
    # TensorFlow parses its error messages in linear time.
    errors.parse_errors_in_linear_time()
    if task.job_name == 'worker':
        # A worker that ends on purpose, from its start-up checks on, tells
        # the ps tasks why: the others quote it instead of waiting for it.
        # At start, a ps started beside it may not be up yet.
        task.end.before_leaving(
            lambda why: task.tell(why, task.end.LAST_WORDS_SECS - 1))
        # In an elastic run, SIGTERM on a worker is a scale-down: it leaves,
        # and the others train on without waiting for it.
        if task.elastic and not task.is_chief:
            task.end.on_preemption(task.scaled_down, FLAGS.preemption_grace)
    task.check_gpu_given()
    return task


class Task:
    """This task of the cluster: its place (job_name, index, is_chief),
    every task's host:port by job (`cluster`, for tf.train.ClusterSpec),
    the `config` of its server and sessions, the chief's `logdir`, how it
    ends (`end`); its methods are the scripts' calls. One line says where
    the cluster came from (see --ps), a second the size of its thread
    pools: --pool_threads, or its share of the host's CPUs (TensorFlow's
    own take every CPU in every task, as if each had the host alone).
    """

    def __init__(self, sync, end, coordinator=False):
        self.sync, self.end = sync, end
        spec, self.job_name, self.index, source = _cluster()
        self.place = sources.Place(spec, self.job_name, self.index)
        self.name, self.is_chief = self.place.name, self.place.is_chief
        self.cluster = spec.as_dict()
        end.name = lambda: self.name
        self.address = (None if self.job_name == 'evaluator' else
                        spec.task_address(self.job_name, self.index))
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
            if FLAGS.pool_threads:
                threads, why = FLAGS.pool_threads, '--pool_threads'
            else:
                threads, why = server.cpu_share(self.cluster, self.address)
            inter = (' (%d inter-op: a long op leaves the others one)'
                     % server.WORKER_INTER_OP if self.job_name == 'worker'
                     and threads < server.WORKER_INTER_OP else '')
            print('%s: %d thread(s) a pool%s: %s' % (self.name, threads,
                                                     inter, why), flush=True)
            server.size_grpc_client(threads)
        self.gpu = self._gpu(coordinator)
        self.config = server.session_config(
            self.job_name, self.index, self.gpu, FLAGS.gpu_memory_fraction,
            threads)
        # This worker's slot on the ps tasks, as it marks it.
        self.slot = liveness.Slot()
        self.min_workers = FLAGS.min_workers or len(self.cluster['worker'])
        self.elastic = self.min_workers < len(self.cluster['worker'])
        self._check_min_workers(coordinator)
        # The chief's --logdir: the others write nothing.
        self.logdir = (Logdir(FLAGS.logdir, self.name,
                              FLAGS.save_checkpoint_secs)
                       if self.is_chief and FLAGS.logdir else None)

    def _check_min_workers(self, coordinator):
        """--min_workers, if given, must be one a run can train with; else
        one line and exit status 2."""
        workers = len(self.cluster['worker'])
        if self.min_workers > workers:
            exits.usage_error('--min_workers=%d, but the cluster lists %d '
                              'workers' % (self.min_workers, workers))
        if self.elastic and coordinator:
            exits.usage_error('--min_workers: TensorFlow 2\'s coordinator '
                              'connects to every listed worker as it starts')
        aggregate = self.sync and (FLAGS.replicas_to_aggregate or workers)
        if self.sync and self.min_workers < aggregate:
            exits.usage_error((
                '--min_workers=%d is below the %d gradients each sync update '
                'aggregates (--replicas_to_aggregate): with fewer workers an '
                'update would wait for good; backup workers, fewer to '
                'aggregate than workers, are the margin sync has'
                % (self.min_workers, aggregate))
                if FLAGS['min_workers'].present else (
                    '--replicas_to_aggregate=%d is above the %d workers '
                    'listed: each update would wait for good'
                    % (aggregate, workers)))

    def scaled_down(self):
        """SIGTERM in an elastic run: this worker leaves, told to the ps
        tasks; returns its line."""
        self.tell('left on SIGTERM (a scale-down)',
                  exits.TaskEnd.LAST_WORDS_SECS)
        return 'left on SIGTERM; the others train on'

    def _gpu(self, coordinator):
        """The index, among the GPUs this process sees, of the one it uses,
        or None: said in a line by a task of --gpu_jobs, and by a worker or
        coordinator that keeps off the GPUs."""
        def role(job, index):
            return ('coordinator' if coordinator and (job, index) == (
                'worker', 0) else job)
        mine = role(self.job_name, self.index)
        seen = ('CUDA_VISIBLE_DEVICES' in os.environ
                and ' (CUDA_VISIBLE_DEVICES=%s)'
                % os.environ['CUDA_VISIBLE_DEVICES'])
        gpus = tf.config.experimental.list_physical_devices('GPU')
        num_gpus, self.gpu_name = len(gpus), ''
        # A GPU given that TensorFlow cannot see ends the task, once it can
        # tell the cluster (start_task()): never a silent fall-back.
        self.gpu_given = (mine in FLAGS.gpu_jobs and not num_gpus
                          and server.gpu_given())
        if mine not in FLAGS.gpu_jobs or not num_gpus:
            if mine in FLAGS.gpu_jobs + ['worker', 'coordinator'] and (
                    not self.gpu_given):
                print('%s: on the CPU: %s%s' % (self.name, (
                    'no GPU found' if mine in FLAGS.gpu_jobs else
                    '--gpu_jobs=%s' % ','.join(FLAGS.gpu_jobs)), seen or ''),
                    flush=True)
            return None
        cap = FLAGS.gpu_memory_fraction and (
            ', at most %g of it (--gpu_memory_fraction)'
            % FLAGS.gpu_memory_fraction)
        gpu, dealt = 0, ''
        if self.address:  # not an evaluator, outside the cluster
            users = [address for job in ('ps', 'worker')
                     for i, address in enumerate(self.cluster[job])
                     if role(job, i) in FLAGS.gpu_jobs]
            gpu, rank, count = server.deal_gpu(users, self.address, num_gpus)
            dealt = ', GPU task %d of %d on %s' % (
                rank + 1, count, self.address.rpartition(':')[0])
        # TensorFlow 1.15 has no word for a GPU's name.
        details = getattr(tf.config.experimental, 'get_device_details',
                          lambda gpu: {})
        self.gpu_name = details(gpus[gpu]).get('device_name', '')
        print('%s: on GPU %d of %d%s%s; memory as it needs it'
              % (self.name, gpu, num_gpus, seen or '', dealt) + (cap or ''),
              flush=True)
        return gpu

    def check_gpu_given(self):
        """Ends this task, status 1, if it was given a GPU (--gpu_jobs) that
        TensorFlow cannot use, in one line: TensorFlow's reason, and the
        ways out."""
        if self.gpu_given:
            raise TaskFailed(
                'given a GPU (%s) that TensorFlow cannot use: %s. Use an '
                'image with CUDA (the Dockerfile\'s --build-arg '
                'TF_EXTRAS=and-cuda) or pip install \'tensorflow[and-cuda]\''
                ', or train on the CPU: --gpu_jobs=' % (
                    self.gpu_given, server.why_no_gpu()))

    def check_gpu(self, task_server, job, index):
        """Ends this task, status 1, if it cannot use its GPU, in one line
        (gpu_line())."""
        if self.gpu is None:
            return
        _, failure = server.check_gpu(
            task_server.target, self.config,
            '/job:%s/replica:0/task:%d/device:GPU:0' % (job, index))
        if failure is not None:
            raise TaskFailed(self.gpu_line(failure, 'keep the %s tasks off '
                                           'the GPUs (--gpu_jobs)' % job))

    def gpu_line(self, error, change=None):
        """The line of a failure of this task's GPU: which one, what went
        wrong in TensorFlow's words, the memory it asked for, and what to
        change; None for an error that is none of a GPU's own (`change`,
        for any error)."""
        found = self.gpu is not None and server.gpu_failure(error.message)
        if not (found or change):
            return None
        cause, change = found or (None, change)
        cap = ('at most %g of its memory (--gpu_memory_fraction)'
               % FLAGS.gpu_memory_fraction if FLAGS.gpu_memory_fraction
               else 'its memory as it needs it, with no cap')
        return 'cannot use GPU %d%s: %s; it asked for %s: %s' % (
            self.gpu, self.gpu_name and ' (%s)' % self.gpu_name,
            '%s (%s)' % (cause, errors.what_went_wrong(error)) if cause
            else errors.what_went_wrong(error), cap, change)

    def tell(self, reason, secs=0):
        """Says why this worker ends on purpose: on the ps tasks (secs: how
        long to try those not up yet), and the chief in its --logdir too,
        for an evaluator."""
        if self.logdir:
            self.logdir.say(CHIEF_LEFT, reason)
        liveness.say_left(self.place.cluster, self.index, reason, secs,
                          self.slot)

    def serve(self, ps_server):
        """server.join() for a ps task, but it ends: once every worker has
        come and gone, or fell silent for --worker_timeout. It ends the
        task, with one line naming a worker that left on purpose and why,
        if one did."""
        self.check_gpu(ps_server, 'ps', self.index)
        ps = PsTask(ps_server, self.place)
        self.end.before_leaving(
            lambda why: ps.tell_workers(why, self.end.LAST_WORDS_SECS))
        self.end.on_preemption(lambda: ps.preempted(FLAGS.preemption_grace),
                               FLAGS.preemption_grace)
        if self.elastic:
            waits = ('the chief and every worker that came have ended; fewer '
                     'than %d workers (--min_workers) for %g s '
                     '(--startup_timeout) end the run'
                     % (self.min_workers, FLAGS.startup_timeout))
        else:
            waits = ('every worker has come and gone; one that has not come '
                     'within %g s (--startup_timeout, and %d s for a worker '
                     'to name the one it waits for) ends the run'
                     % (FLAGS.startup_timeout, STARTUP_GRACE_SECS))
        print('%s: serving until %s' % (self.name, waits), flush=True)
        left = ps.serve_until_workers_gone(
            FLAGS.startup_timeout, FLAGS.worker_timeout, self.min_workers)
        # Ctrl-C or SIGTERM may have begun its end: its line is the last.
        if self.end.ending():
            threading.Event().wait()
        if left:
            index, reason = left[0]
            others = (' (and %d more: their own lines say why)'
                      % (len(left) - 1) if len(left) > 1 else '')
            print('%s: every worker has ended; %s left%s: "%s"'
                  % (self.name, self.place.task('worker', index), others,
                     reason), flush=True)
        self.end.leave()

    def load_mnist(self, images_per_run):
        """The data sets of --data_dir, or the end of this task saying why
        not. With --shard_data, this worker's own slice of the training
        set."""
        try:
            mnist = mnist_data.read_data_sets(
                FLAGS.data_dir, FLAGS.validation_size, FLAGS.data_mirror)
        except mnist_data.DataError as e:
            raise TaskFailed(e)
        if FLAGS.shard_data:
            num_workers = len(self.cluster['worker'])
            mnist = mnist._replace(train=mnist_data.Split(
                mnist.train.images[self.index::num_workers],
                mnist.train.labels[self.index::num_workers]))
        if len(mnist.train.images) < images_per_run:
            raise TaskFailed('%d training images are fewer than the %d of '
                             'one session.run (--batch_size%s)'
                             % (len(mnist.train.images), images_per_run,
                                '' if self.sync else
                                ', times --steps_per_run'))
        return mnist

    def check_logdir(self):
        """The chief's --logdir, which it writes, must take a file: else one
        line and exit status 2 before it joins the cluster."""
        if self.logdir:
            self.logdir.check()
            self.logdir.forget_ended()

    def sync_tokens(self, optimizer, chief_queue_runner, init_token_op,
                    global_step, last_step):
        """SyncTokens: the chief's queue runner and tokens in each new
        session, and the workers' tokens when a task is lost."""
        return SyncTokens(optimizer, chief_queue_runner, init_token_op,
                          self.is_chief, global_step, last_step,
                          len(self.cluster['worker']))

    def training_session(self, sv, worker_server, last_step, tokens=None):
        """sv.prepare_or_wait_for_session(server.target), once the ps tasks
        are up, in a session that outlives a lost ps (ps_cluster/README.md);
        sync's `tokens` start the chief's updates in each new session. In an
        elastic run, a worker other than the chief that comes once the run
        is over, its global step at last_step, says so and ends the task,
        status 0: as the chief's marker in --logdir says, or the global
        step on the ps (without --min_workers, it measures the model as
        any worker does at the end)."""
        self.check_gpu(worker_server, 'worker', self.index)
        self._came_after_the_end(self._marked_end(),
                                 last_step)  # it may end the task
        # Its threads' failures raised in the main thread, which is ended
        # only if stuck in TensorFlow.
        # One clock for the wait for a lost ps, which the stall watch and
        # the session's recovery both read.
        outage = Outage(FLAGS.ps_timeout, '--ps_timeout')
        watch = StallWatch(self.end, self.place, FLAGS.stall_timeout, outage,
                           self.elastic)
        watch.start()
        creator = SessionCreator(sv, worker_server, self.config, self.place,
                                 [tokens] if tokens else [], watch,
                                 FLAGS.startup_timeout,
                                 FLAGS.preemption_grace, self.logdir, tokens,
                                 self.slot)
        try:
            sess = RecoverableSession(creator, outage).open()
        except TaskFailed as e:
            # The ps tasks leave once the run has ended: an elastic run's,
            # once the chief and the workers that came have.
            self._came_after_the_end(self._marked_end(
                waited=isinstance(e, probes.NotUp)),
                last_step)  # it may end the task
            # A ps that never came up may have left with the run.
            if self.elastic and isinstance(e, probes.NotUp):
                raise TaskFailed('%s; the run may have ended before this '
                                 'worker came' % e.message)
            raise
        if self.elastic and not self.is_chief:
            self._came_after_the_end(sess.run(sv.global_step), last_step,
                                     sess)  # it may end the task
        # From now on a ps that does not answer is lost, not late: one try.
        self.end.before_leaving(self.tell)
        if self.is_chief:
            self.end.on_preemption(lambda: print(
                'worker=0: preempted: %s' % creator.preempted(), flush=True),
                FLAGS.preemption_grace)
        return sess

    def _marked_end(self, waited=False):
        """The global step at which the chief ended its run, from its marker
        in --logdir, for a worker of an elastic run other than the chief,
        once no ps task has come up for STARTUP_GRACE_SECS (or it `waited`
        for them already, in vain); else None. A run ends as its ps tasks
        leave: a marker beside a ps that listens is an earlier run's, which
        this run's chief has yet to remove (one slower to come up than that
        is taken for a run that ended)."""
        if not (self.elastic and not self.is_chief and FLAGS.logdir):
            return None
        ps = self.place.cluster.job_tasks('ps')
        if poll(lambda: any(map(probes.is_listening, ps)),
                0 if waited else STARTUP_GRACE_SECS, 0.2):
            return None
        return marker(FLAGS.logdir, CHIEF_DONE, 0)

    def _came_after_the_end(self, step, last_step, sess=None):
        """If step, the run's, is at last_step: says so, closes sess (this
        worker marked done), and ends the task, status 0."""
        if step is not None and int(step) >= last_step:
            print('worker=%d: the run ended at global_step=%d, before this '
                  'worker came: nothing is left to train' % (self.index,
                                                             int(step)),
                  flush=True)
            if sess:
                sess.close()
            self.end.leave()

    def epochs(self, epochs):
        """The async workers' epochs: `epochs` each, or, in an elastic run,
        as many as it takes them to reach its last global step."""
        return itertools.count() if self.elastic else range(epochs)

    def training_log(self, sv, sess, global_step, mnist, accuracy_op, x_p,
                     y_p):
        """What this worker prints beyond the book's lines: first, where
        the model's variables live, which a chief with --logdir writes for
        TensorBoard too; its gradients' staleness, which it writes in
        --logdir/staleness; and the chief's summaries of accuracy_op on
        mnist's splits."""
        def accuracy_on(split):
            split = mnist_data.as_float(split)
            return sess.run(accuracy_op, {x_p: split.images,
                                          y_p: split.labels})
        # Only the sync script's accumulators drop stale gradients.
        staleness = Staleness(drops_stale=self.sync)
        # TensorBoard shows each worker's histogram as a run of its own.
        staleness_dir = FLAGS.logdir and os.path.join(
            FLAGS.logdir, 'staleness', 'worker_%d' % self.index)
        where = placement.lines(
            tf.trainable_variables() + [tf.train.get_global_step()],
            self.place.tasks('ps'))
        # How far the run is: it ends at a global step, and the book's
        # async workers each after their own epochs.
        steps_per_epoch = len(mnist.train.images) // FLAGS.batch_size
        last_step = FLAGS.epochs * steps_per_epoch * (
            1 if self.sync else len(self.cluster['worker']))
        return TrainingLog(sv, sess, global_step, self.index, accuracy_on,
                           mnist, staleness, staleness_dir, where,
                           FLAGS.epochs, steps_per_epoch, last_step,
                           own_epochs=not (self.sync or self.elastic))

    def evaluate(self, model, loss_and_accuracy, mnist, last_step,
                 logdir=None):
        """An evaluator's run: each new checkpoint in --logdir, measured on
        --eval_split, until the run's last, at last_step or where the chief
        ended; then, with --export_dir, its SavedModel. It waits while the
        chief answers, and --eval_timeout after. It ends the task; first,
        one line if it cannot write its summaries there. With `logdir` (a
        TF2 run's), it follows that, and the coordinator exports."""
        export = logdir is None
        logdir = logdir or FLAGS.logdir
        Logdir(logdir, self.name).check()
        split = mnist_data.as_float(getattr(mnist, FLAGS.eval_split))
        chief = self.cluster['worker'][0]
        evaluator.follow(model, loss_and_accuracy, split, FLAGS.eval_split,
                         logdir, last_step, FLAGS.eval_timeout,
                         mnist_data.IMAGE_PIXELS, config=self.config,
                         on_last=export and (lambda step, values: (
                             self._export(model, values, step, mnist))),
                         chief_answers=lambda: probes.answers(chief))
        self.end.leave()

    def export(self, sess, model, mnist):
        """With --export_dir, the chief writes the model as a SavedModel for
        serving, once every other worker has ended, and says its test
        accuracy."""
        # Under srun every task has the same flags: one writer, the
        # evaluator.
        if FLAGS.export_dir and self.is_chief and not FLAGS.slurm_evaluator:
            # Until every other worker has ended or is gone: the model then
            # holds the run's last step.
            sess.session.watchdog.wait_for_the_others()
            variables = (tf.trainable_variables()
                         + [tf.train.get_global_step()])
            # With --split_w, w/part_0, w/part_1, ...: one w, as model()
            # makes.
            parts = collections.defaultdict(list)
            for variable, value in zip(variables, sess.run(variables)):
                parts[variable.op.name.split('/part_')[0]].append(value)
            values = {name: np.concatenate(part) if len(part) > 1 else part[0]
                      for name, part in parts.items()}
            self._export(model, values, values['global_step'], mnist)

    def _export(self, model, values, step, mnist):
        """One writer per export, which says the model's accuracy on mnist's
        test split: the chief and an evaluator may both have --export_dir;
        the second to come finds the same model there."""
        if not FLAGS.export_dir:
            return
        path = os.path.join(FLAGS.export_dir, str(step))
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


def _cluster():
    """(ClusterSpec, this task's job and index, their source), or one line
    and exit status 2 saying what is wrong."""
    given = FLAGS['ps'].present or FLAGS['worker'].present
    # An sbatch script's own shell has SLURM_PROCID too, but is no step of
    # srun: tasks started there by hand describe the cluster with flags.
    found = [name for name, present in (
        ('--ps/--worker', given), ('TF_CONFIG', 'TF_CONFIG' in os.environ),
        ('Slurm', 'SLURM_STEP_ID' in os.environ)) if present]
    if given and len(found) > 1:
        exits.usage_error('both %s describe the cluster: give one'
                          % ' and '.join(found))
    source = found[0] if found else 'the defaults of --ps/--worker'
    job_name, index = FLAGS.job_name, FLAGS.task_index
    try:
        if source == 'TF_CONFIG':
            cluster, job_name, index = _agreeing(source,
                                                 *sources.from_tf_config())
        elif source == 'Slurm':
            cluster, job_name, index = _agreeing(source, *sources.from_slurm(
                FLAGS.num_ps, FLAGS.slurm_port_base, FLAGS.slurm_evaluator))
        else:
            cluster = sources.from_host_lists(FLAGS.ps, FLAGS.worker)
        sources.check(cluster)
    except ValueError as e:
        exits.usage_error('%s: %s' % (source, e))
    if job_name is None:
        exits.usage_error('--job_name is required: ps, worker or evaluator')
    if job_name == 'evaluator' and not FLAGS.logdir:
        exits.usage_error('an evaluator follows the checkpoints of --logdir: '
                          'give it')
    if job_name != 'evaluator' and index >= cluster.num_tasks(job_name):
        exits.usage_error('--task_index=%d, but %s lists only %d %s task(s)'
                          % (index, source, cluster.num_tasks(job_name),
                             job_name))
    return cluster, job_name, index, source


def _agreeing(source, cluster, job_name, task_index):
    """The cluster, and this task's job and index as the source found them
    (None: the flag's), which flags given too must agree with."""
    found = []
    for name, value in (('job_name', job_name), ('task_index', task_index)):
        if FLAGS[name].present and FLAGS[name].value != value:
            exits.usage_error('--%s=%s, but %s says %s'
                              % (name, FLAGS[name].value, source, value))
        found.append(FLAGS[name].value if value is None else value)
    return (cluster, *found)


def slow_gradients(ms, global_step):
    """A straggler on purpose: (the gradient of the loss with respect to
    itself, 1, given once this worker has waited ms milliseconds in its
    session.run and then read the global step; that read, copied on the
    ps). Gradients that start from the 1 come after both, so the read tells
    whether an update passed them first. For 0: (None, which minimize()
    takes as the book's 1 at once; the global step as the run starts)."""
    if not ms:
        return None, global_step_copy(global_step)
    waited = tf.numpy_function(lambda: time.sleep(ms / 1000) or np.int64(0),
                               [], tf.int64, name='slow_gradients')
    step = global_step_copy(global_step, waited)
    # Computed from the read, not after it: grappler drops a control
    # dependency when it folds the Reshape into the gradients' own.
    one = tf.numpy_function(lambda step: np.float32(1), [step], tf.float32)
    return tf.reshape(one, []), step
