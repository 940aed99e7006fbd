"""The cluster side of mnist_dist_async.py and mnist_dist_sync.py: the
cluster's flags, and the few calls each script makes to run as one task of a
parameter-server cluster, each standing in for a line of the book's script
or adding what a real cluster needs. What they need beneath them is in
ps_cluster/, one module per concern.

Importing it only defines flags: the scripts set TensorFlow up themselves.
"""

import collections
import os
import sys
import threading
import time

import numpy as np
import tensorflow.compat.v1 as tf
from absl import flags

import mnist_data
from ps_cluster import (errors, evaluator, exits, liveness, placement,
                        probes, server, sources)
from ps_cluster.exits import TaskFailed
from ps_cluster.export import Exists, export_saved_model
from ps_cluster.logdir import Logdir
from ps_cluster.ps_task import PsTask
from ps_cluster.recoverable_session import RecoverableSession, Timeouts
from ps_cluster.stall_watch import StallWatch
from ps_cluster.staleness import Staleness, global_step_copy
# The scripts' own calls: copies of the steps that measure staleness.
from ps_cluster.staleness import (  # noqa: F401
    global_steps_around, local_step_copy)
from ps_cluster.sync_tokens import SyncTokens
from ps_cluster.training_log import TrainingLog

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
                     'TensorFlow\'s intra-op and inter-op pools, and its '
                     'gRPC client\'s. 0: its share of the CPUs it may use '
                     '(its affinity, its cgroup\'s quota), divided among '
                     'the cluster\'s tasks on its host.', lower_bound=0)
flags.DEFINE_float('gpu_memory_fraction', 0.2,
                   'Share of a GPU\'s memory each worker may take, so that '
                   'several workers fit on one GPU.')
flags.DEFINE_string('logdir', None,
                    'Where the chief writes summaries for TensorBoard and '
                    'checkpoints, and each worker its staleness; a run with '
                    'the same logdir resumes from the last checkpoint. '
                    'Nothing is written without it.')
flags.DEFINE_float('save_checkpoint_secs', 60,
                   'Seconds between the chief\'s checkpoints in --logdir.')
flags.DEFINE_float('startup_timeout', 120,
                   'Seconds to wait for the other tasks to come up.')
flags.DEFINE_float('ps_timeout', 120,
                   'Seconds a worker waits for a ps task it lost to come '
                   'back (a restarted pod or requeued task) before it gives '
                   'up.')
flags.DEFINE_float('stall_timeout', 180,
                   'Seconds without a new global step after which every '
                   'worker gives up, naming the workers that are gone or '
                   'the ps task that does not answer, whatever it waits in.')
flags.DEFINE_float('worker_timeout', 120,
                   'Seconds a ps waits for workers that fell silent (a '
                   'network cut, a rebooting node) before it leaves a run '
                   'that every other worker has left.')
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
for _name in ('eval_timeout', 'stall_timeout', 'startup_timeout', 'ps_timeout',
              'worker_timeout', 'save_checkpoint_secs'):
    flags.register_validator(_name, lambda v: v > 0, 'must be positive')
flags.register_validator('gpu_memory_fraction', lambda v: 0 < v <= 1,
                         'must be in (0, 1]')


@flags.multi_flags_validator(['ps', 'worker'],
                             message='the cluster flags do not fit together')
def _check_host_lists(values):
    for job in ('ps', 'worker'):
        try:
            sources.parse_host_list(values[job])
        except ValueError as e:
            raise flags.ValidationError('--%s: %s' % (job, e))
    return True


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


def _task_name():
    return '/job:%s/task:%d' % (FLAGS.job_name, FLAGS.task_index)


# How this task ends, whichever thread ends it.
_end = exits.TaskEnd(_task_name)


def end_in_one_line():
    """Sets up how this task ends, for the whole process: Ctrl-C and
    SIGTERM end it at once with one line, inside sess.run too, and after
    Ctrl-C the other tasks are told why. Python's excepthook does the same
    for a failure of ours (TaskFailed), raised wherever it was found, and
    for a tf.train.Server whose port is taken; threading's says in one line
    why a thread of TensorFlow's or ours failed, and the task goes on. And
    TensorFlow parses its error messages in linear time."""
    _end.on_signals()

    def one_line(kind, error, traceback):
        if issubclass(kind, TaskFailed):
            _end.fail(error.message, error.status)
        if kind is tf.errors.UnknownError and (
                'Could not start gRPC server' in error.message):
            _end.fail('cannot listen on port %s (%s): is it in use?' % (
                _address.rpartition(':')[2], _address))
        sys.__excepthook__(kind, error, traceback)
    sys.excepthook = one_line

    def thread_failed(args):
        if Logdir.is_summary_writer(args.thread):
            Logdir(FLAGS.logdir, _task_name()).failed('write summaries',
                                                      args.exc_value)
        else:
            print('%s: error: %s failed: %s' % (
                _task_name(), args.thread.name, args.exc_value),
                file=sys.stderr, flush=True)
    threading.excepthook = thread_failed
    errors.parse_errors_in_linear_time()


# This task's host:port and place in the cluster, once cluster_hosts() has
# found them.
_address = _place = None
_threads = 0


def cluster_hosts():
    """Every task's host:port by job, for tf.train.ClusterSpec, and this
    task's place in the cluster, from the first of: --ps and --worker;
    TF_CONFIG; Slurm's variables inside a step of srun; the defaults of
    --ps and --worker. One line says which. It sets --job_name and
    --task_index where TF_CONFIG or Slurm give them."""
    global _address, _place
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
    try:
        if source == 'TF_CONFIG':
            cluster = _take_task(source, *sources.from_tf_config())
        elif source == 'Slurm':
            cluster = _take_task(source, *sources.from_slurm(
                FLAGS.num_ps, FLAGS.slurm_port_base, FLAGS.slurm_evaluator))
        else:
            cluster = sources.from_host_lists(FLAGS.ps, FLAGS.worker)
        sources.check(cluster)
    except ValueError as e:
        exits.usage_error('%s: %s' % (source, e))
    if FLAGS.job_name is None:
        exits.usage_error('--job_name is required: ps, worker or evaluator')
    if FLAGS.job_name == 'evaluator':
        if not FLAGS.logdir:
            exits.usage_error('an evaluator follows the checkpoints of '
                              '--logdir: give it')
        here = 'this task follows its checkpoints'
    else:
        tasks = cluster.num_tasks(FLAGS.job_name)
        if FLAGS.task_index >= tasks:
            exits.usage_error('--task_index=%d, but %s lists only %d %s '
                              'task(s)' % (FLAGS.task_index, source, tasks,
                                           FLAGS.job_name))
        _address = cluster.task_address(FLAGS.job_name, FLAGS.task_index)
        here = 'this task: ' + _address
    if source == 'Slurm':
        here += ' (Slurm task %s on %s)' % (os.environ['SLURM_PROCID'],
                                           os.environ.get('SLURMD_NODENAME'))
    _place = sources.Place(cluster, FLAGS.job_name, FLAGS.task_index)
    print('%s: cluster from %s: ps %s, workers %s; %s'
          % (_place.name, source, ','.join(cluster.job_tasks('ps')),
             ','.join(cluster.job_tasks('worker')), here), flush=True)
    if _address:
        _size_pools(cluster.as_dict())
    if FLAGS.job_name == 'worker':
        # A worker that ends on purpose, from its start-up checks on, tells
        # the ps tasks why: the others quote it instead of waiting for it.
        # At start, a ps started beside it may not be up yet.
        _end.before_leaving(_telling(_end.LAST_WORDS_SECS - 1))
    return cluster.as_dict()


def _size_pools(cluster):
    """This task's thread pools: --pool_threads, or its share of the host's
    CPUs. One line says which; TensorFlow's own defaults take every CPU in
    every task, as if each had the host alone."""
    global _threads
    if FLAGS.pool_threads:
        _threads, why = FLAGS.pool_threads, '--pool_threads'
    else:
        _threads, why = server.cpu_share(cluster, _address)
    print('%s: %d thread(s) a pool: %s' % (_place.name, _threads, why),
          flush=True)
    server.size_grpc_client(_threads)


def _telling(secs=0):
    """How this worker tells why it ends on purpose: on the ps tasks (secs:
    how long to try those not up yet), and the chief in its --logdir too,
    for an evaluator."""
    logdir = _chief_logdir()

    def tell(reason):
        if logdir:
            logdir.say_left(reason)
        liveness.say_left(_place.cluster, _place.index, reason, secs)
    return tell


def _take_task(source, cluster, job_name, task_index):
    """This task's job and index, as the source found them, unless given
    as flags, which must agree."""
    for name, value in (('job_name', job_name), ('task_index', task_index)):
        if FLAGS[name].present and FLAGS[name].value != value:
            exits.usage_error('--%s=%s, but %s says %s'
                              % (name, FLAGS[name].value, source, value))
        if value is not None:
            setattr(FLAGS, name, value)
    return cluster


def check_logdir():
    """The chief's --logdir, which it writes, must take a file: else one
    line and exit status 2 before it joins the cluster."""
    logdir = _chief_logdir()
    if logdir:
        _check(logdir)
        logdir.forget_ended()


def _check(logdir):
    try:
        logdir.check()
    except ValueError as e:
        raise TaskFailed(e, status=2)  # a usage error


def join(ps_server):
    """server.join() for a ps task, but it ends: once every worker has come
    and gone, or fell silent for --worker_timeout. It ends the task, with
    one line naming a worker that left on purpose and why, if one did."""
    ps = PsTask(ps_server, _place)
    _end.before_leaving(lambda why: ps.tell_workers(why,
                                                    _end.LAST_WORDS_SECS))
    left = ps.serve_until_workers_gone(FLAGS.startup_timeout,
                                       FLAGS.worker_timeout)
    if left:
        index, reason = left[0]
        others = (' (and %d more: their own lines say why)' % (len(left) - 1)
                  if len(left) > 1 else '')
        print('%s: every worker has ended; %s left%s: "%s"'
              % (_place.name, _place.task('worker', index), others, reason),
              flush=True)
    _end.leave()


def load_mnist(cluster, images_per_run):
    """The data sets of --data_dir, or the end of this task saying why not.
    With --shard_data, this worker's own slice of the training set."""
    try:
        mnist = mnist_data.read_data_sets(
            FLAGS.data_dir, FLAGS.validation_size, FLAGS.data_mirror)
    except mnist_data.DataError as e:
        raise TaskFailed(e)
    if FLAGS.shard_data:
        num_workers = cluster.num_tasks('worker')
        mnist = mnist._replace(train=mnist_data.Split(
            mnist.train.images[FLAGS.task_index::num_workers],
            mnist.train.labels[FLAGS.task_index::num_workers]))
    if len(mnist.train.images) < images_per_run:
        raise TaskFailed('%d training images are fewer than the %d of one '
                         'session.run (--batch_size%s)'
                         % (len(mnist.train.images), images_per_run,
                            ', times --steps_per_run'
                            if 'steps_per_run' in FLAGS else ''))
    return mnist


def sync_tokens(optimizer, chief_queue_runner, init_token_op, cluster,
                global_step, last_step):
    """What a SyncReplicasOptimizer's chief does with its queue runner and
    tokens, and what the workers do with the tokens when a worker or a ps
    is lost."""
    return SyncTokens(optimizer, chief_queue_runner, init_token_op,
                      _place.is_chief, global_step, last_step,
                      cluster.num_tasks('worker'))


def training_session(sv, worker_server, tokens=None):
    """sv.prepare_or_wait_for_session(server.target), once the ps tasks are
    up, in a session that waits for a lost ps to come back and trains on.
    The chief restores the last checkpoint in --logdir, or joins the model
    live on the ps."""
    timeouts = Timeouts(FLAGS.startup_timeout, FLAGS.ps_timeout,
                        FLAGS.stall_timeout)
    # The one thread that may end this worker while its main thread waits
    # in TensorFlow.
    stall = StallWatch(timeouts.stall, timeouts.ps, _end.fail)
    sess = RecoverableSession(sv, worker_server, _place, session_config(),
                              timeouts, stall, _chief_logdir(), tokens)
    # From now on a ps that does not answer is lost, not late: one try.
    _end.before_leaving(_telling())
    return sess


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


def training_log(sv, sess, global_step, mnist, accuracy_op, x_p, y_p):
    """What this worker prints beyond the book's lines: first, where the
    model's variables live, which a chief with --logdir writes for
    TensorBoard too; its gradients' staleness, which it writes in
    --logdir/staleness; and the chief's summaries of accuracy_op on
    mnist's splits."""
    def accuracy_on(split):
        split = mnist_data.as_float(split)
        return sess.run(accuracy_op, {x_p: split.images, y_p: split.labels})
    # Only the sync script's accumulators drop stale gradients.
    staleness = Staleness(drops_stale='replicas_to_aggregate' in FLAGS)
    # TensorBoard shows each worker's histogram as a run of its own.
    staleness_dir = FLAGS.logdir and os.path.join(
        FLAGS.logdir, 'staleness', 'worker_%d' % _place.index)
    where = placement.lines(
        tf.trainable_variables() + [tf.train.get_global_step()],
        _place.tasks('ps'))
    return TrainingLog(sv, sess, global_step, _place.index, accuracy_on,
                       mnist, staleness, staleness_dir, where)


def evaluate(model, loss_and_accuracy, mnist, last_step):
    """An evaluator's run: each new checkpoint in --logdir, measured on
    --eval_split, until the run's last, at last_step or where the chief
    ended; then, with --export_dir, its SavedModel. It waits while the chief
    answers, and --eval_timeout after. It ends the task; first, one line if
    it cannot write its summaries in --logdir."""
    _check(Logdir(FLAGS.logdir, _task_name()))
    split = mnist_data.as_float(getattr(mnist, FLAGS.eval_split))
    chief = _place.cluster.task_address('worker', 0)
    evaluator.follow(model, loss_and_accuracy, split, FLAGS.eval_split,
                     FLAGS.logdir, last_step, FLAGS.eval_timeout,
                     mnist_data.IMAGE_PIXELS,
                     on_last=lambda step, values: _export(
                         model, values, step,
                         mnist_data.as_float(mnist.test)),
                     chief_answers=lambda: probes.answers(chief))
    _end.leave()


def export(sess, model, mnist):
    """With --export_dir, the chief writes the model as a SavedModel for
    serving, once every other worker has ended, and says its test accuracy."""
    # Under srun every task has the same flags: one writer, the evaluator.
    if FLAGS.export_dir and _place.is_chief and not FLAGS.slurm_evaluator:
        sess.wait_for_the_others()
        variables = tf.trainable_variables() + [tf.train.get_global_step()]
        # With --split_w, w/part_0, w/part_1, ...: one w, as model() makes.
        parts = collections.defaultdict(list)
        for variable, value in zip(variables, sess.run(variables)):
            parts[variable.op.name.split('/part_')[0]].append(value)
        values = {name: np.concatenate(part) if len(part) > 1 else part[0]
                  for name, part in parts.items()}
        _export(model, values, values['global_step'],
                mnist_data.as_float(mnist.test))


def _export(model, values, step, test):
    """One writer per export: the chief and an evaluator may both have
    --export_dir; the second to come finds the same model there."""
    if not FLAGS.export_dir:
        return
    path = os.path.join(FLAGS.export_dir, str(step))
    try:
        accuracy = export_saved_model(model, values, path, test,
                                      mnist_data.IMAGE_PIXELS)
    except Exists as e:
        if not e.same_model:
            raise TaskFailed('cannot export the model to %s: it exists, and '
                             'holds another model' % path)
        print('%s: the model at global_step=%d is exported already, to %s'
              % (_place.name, step, path), flush=True)
        return
    except (tf.errors.OpError, OSError) as e:
        raise TaskFailed('cannot export the model to %s (%s)'
                         % (path, errors.what_went_wrong(e)))
    print('%s: exported the model at global_step=%d to %s; its test '
          'accuracy = %s' % (_place.name, step, path, accuracy), flush=True)


def leave():
    """Ends this task at once, status 0: TensorFlow cannot stop its server."""
    _end.leave()


def session_config():
    """The config of this task's server and sessions: the book's, a
    worker's device filter, and the pools' size."""
    return server.session_config(FLAGS.job_name, FLAGS.task_index,
                                 FLAGS.gpu_memory_fraction, _threads)


def _chief_logdir():
    """The chief's --logdir, or None: the others write nothing."""
    if _place.is_chief and FLAGS.logdir:
        return Logdir(FLAGS.logdir, _place.name, FLAGS.save_checkpoint_secs)
    return None
