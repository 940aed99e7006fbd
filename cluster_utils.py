"""The cluster side of mnist_dist_async.py and mnist_dist_sync.py: the
cluster's flags, read once, and this task in its role (start_task()),
whose calls stand in for a line of the book's script or add what a real
cluster needs, from ps_cluster/ beneath, which reads no flag. Importing it
only defines flags: the scripts set TensorFlow up themselves.
"""

import os
import sys
import threading
import time
import traceback

import numpy as np
import tensorflow.compat.v1 as tf
from absl import flags

import mnist_data
from ps_cluster import errors, exits, settings, sources
from ps_cluster.evaluator.role import Evaluator
from ps_cluster.exits import TaskFailed
from ps_cluster.logdir import Logdir
from ps_cluster.ps.role import Ps
from ps_cluster.worker.role import Worker
from ps_cluster.worker.staleness import global_step_copy
# The scripts' own calls: copies of the steps that measure staleness.
from ps_cluster.worker.staleness import (  # noqa: F401
    global_steps_around, local_step_copy)

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
for _name in settings.LIMITS + ('save_checkpoint_secs',):
    flags.register_validator(_name, lambda v: v > 0, 'must be positive')
flags.register_validator('gpu_memory_fraction',
                         lambda v: v is None or 0 < v <= 1,
                         'must be in (0, 1]')
GPU_JOB_NAMES = ('worker', 'ps', 'evaluator', 'coordinator')
flags.register_validator('gpu_jobs', lambda v: set(v) <= set(GPU_JOB_NAMES),
                         'must name jobs of %s' % ', '.join(GPU_JOB_NAMES))


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
    """This task, in its role (a Worker, Ps or Evaluator, on the flags read
    once into a settings.Settings; `sync`: of mnist_dist_sync.py;
    `coordinator`: worker 0 coordinates and trains nothing, TF2's), set to
    end in one line: Ctrl-C and SIGTERM at once, inside sess.run too, the
    cluster told why after Ctrl-C; a failure of ours (TaskFailed), a port
    in use, and any other error as the main thread raises it, and a
    thread's that no coordinator stores."""
    end = exits.TaskEnd(lambda: '/job:%s/task:%d' % (FLAGS.job_name,
                                                    FLAGS.task_index))
    end.on_signals()
    task = this_task(sync, end, coordinator)
    tracebacks = task.settings.tracebacks

    def one_line(kind, error, trace):
        if tracebacks:
            traceback.print_exception(kind, error, trace)
        if issubclass(kind, TaskFailed):
            task.end.fail(error.message, error.status)  # it ends the task
        if kind is tf.errors.UnknownError and (
                'Could not start gRPC server' in error.message):
            task.end.fail('cannot listen on port %s (%s): is it in use?' % (
                task.address.rpartition(':')[2], task.address))
        if issubclass(kind, tf.errors.OpError):
            task.end.fail(task.gpu.line(error)
                          or errors.what_went_wrong(error))
        # Any other, a line too: TensorFlow raises more than its own.
        task.end.fail('%s: %s' % (kind.__name__, error))
    sys.excepthook = one_line

    def thread_failed(args):
        if tracebacks:
            traceback.print_exception(args.exc_type, args.exc_value,
                                      args.exc_traceback)
        # Not stored: summaries lost cost the summaries, not the run. It is
        # TensorFlow's thread that writes them, which ends at the first
        # write that fails, and TrainingLog writes no more.
        if type(args.thread).__name__ == '_EventLoggerThread':
            Logdir(task.settings.logdir, task.name).failed('write summaries',
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
    task.gpu.check_given()
    return task


def this_task(sync, end, coordinator=False):
    """This task in its role, from the flags as parsed (start_task()'s
    arguments, and `end`, its exits.TaskEnd)."""
    spec, job_name, index, source = _cluster()
    role = {'ps': Ps, 'worker': Worker, 'evaluator': Evaluator}[job_name]
    return role(settings.read(FLAGS), end, spec, job_name, index, source,
                sync, coordinator)


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
