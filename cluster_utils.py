"""The cluster side of mnist_dist_async.py and mnist_dist_sync.py.

In this order: the cluster's flags; one-line errors; where the cluster comes
from (flags, TF_CONFIG, Slurm); this task's server and session configs; each
worker's data; errors of the cluster; what a worker reports; signals; the
end of a task. Which tasks are alive is liveness.py's, the session a
worker trains in training_session.py's.

Importing it only defines things: the scripts set TensorFlow up themselves.
"""

import contextlib
import os
import re
import signal
import sys
import threading
import time

import tensorflow.compat.v1 as tf
from absl import flags

import mnist_data

# ------------------------------------------------------------------- flags

FLAGS = flags.FLAGS

flags.DEFINE_enum('job_name', None, ['ps', 'worker'], 'Role of this task.')
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
flags.DEFINE_integer('validation_size', 5000,
                     'Training images held out for validation.', lower_bound=0)
flags.DEFINE_integer('print_every_epochs', 10,
                     'Log the loss every this many epochs.', lower_bound=1)
flags.DEFINE_float('gpu_memory_fraction', 0.2,
                   'Share of a GPU\'s memory each worker may take, so that '
                   'several workers fit on one GPU.')
flags.DEFINE_string('logdir', None,
                    'Where the chief writes summaries for TensorBoard and '
                    'checkpoints; a run with the same logdir resumes from '
                    'the last checkpoint. Nothing is written without it.')
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
flags.register_validator('stall_timeout', lambda v: v > 0,
                         'must be positive')
flags.register_validator('gpu_memory_fraction', lambda v: 0 < v <= 1,
                         'must be in (0, 1]')
flags.register_validator('startup_timeout', lambda v: v > 0,
                         'must be positive')
flags.register_validator('ps_timeout', lambda v: v > 0, 'must be positive')
flags.register_validator('worker_timeout', lambda v: v > 0,
                         'must be positive')
flags.register_validator('save_checkpoint_secs', lambda v: v > 0,
                         'must be positive')


def parse_host_list(value):
    """'h1:p1,h2:p2' -> ['h1:p1', 'h2:p2'], or ValueError saying what is wrong."""
    hosts = [h.strip() for h in value.split(',')]
    for host in hosts:
        name, _, port = host.rpartition(':')
        if (not re.fullmatch(r'[\w.-]+|\[[0-9a-fA-F:.]+\]', name)
                or not port.isdigit() or not 0 < int(port) < 65536):
            raise ValueError('%r is not host:port' % host)
    return hosts


@flags.multi_flags_validator(['ps', 'worker'],
                             message='the cluster flags do not fit together')
def _check_host_lists(values):
    for job in ('ps', 'worker'):
        try:
            parse_host_list(values[job])
        except ValueError as e:
            raise flags.ValidationError('--%s: %s' % (job, e))
    return True


def parse_flags(argv):
    """absl's parser, but a usage error is one line and exit status 2; and
    ~ at the start of --data_dir or --logdir is the home directory, as in a
    shell, which does not expand it after '='."""
    try:
        argv = FLAGS(argv)
    except flags.Error as e:
        usage_error(e)
    for name in ('data_dir', 'logdir'):
        if FLAGS[name].value:
            FLAGS[name].value = os.path.expanduser(FLAGS[name].value)
    return argv


# --------------------------------------------------------- one-line errors

def task_name():
    return '/job:%s/task:%d' % (FLAGS.job_name, FLAGS.task_index)


def usage_error(message):
    print('%s: error: %s' % (os.path.basename(sys.argv[0]), message),
          file=sys.stderr)
    sys.exit(2)


def fail(message):
    """Ends this task with a one-line error and exit status 1, once it has
    told the cluster why."""
    _end_once()
    print('%s: error: %s' % (task_name(), message), file=sys.stderr,
          flush=True)
    say_last_words(str(message))
    sys.exit(1)


def what_went_wrong(error):
    """The line of an error that says what went wrong: its first, or, in
    TensorFlow 2's 'Graph execution error', the one after the failed op's
    name."""
    lines = getattr(error, 'message', str(error)).splitlines()
    for line, after in zip(lines, lines[1:]):
        if line.startswith('Node: '):
            return after
    return lines[0]


def die(message, status=1, on_purpose=True):
    """One line on stderr, and the whole task ends at once, from any thread;
    on purpose, it tells the cluster why first.

    With os._exit: closing a session whose ps is gone, or that another
    thread is inside, can block for good, and so can the interpreter's own
    clean-up.
    """
    _end_once()
    try:
        print('%s: %s' % (task_name(), message), file=sys.stderr, flush=True)
    except OSError:  # nobody reads stderr any more
        pass
    if on_purpose:
        say_last_words(message[len('error: '):] if message.startswith(
            'error: ') else message)
    os._exit(status)


# Taken by the first thread that ends this task. A second one waits for
# it: Ctrl-C while a ps tells an error of its own, or its last worker leaving
# while it tells why it ends, must not change the line or the exit status.
_ending = threading.Lock()


def _end_once():
    if not _ending.acquire(blocking=False):
        threading.Event().wait()


# Callables that tell the other tasks why this one ends on purpose: a ps's
# (liveness.py) or a worker's (training_session.py), called by the thread
# that ends the task.
_last_words = []
# How long the last words may take: a ps gives the workers time to read them.
LAST_WORDS_SECS = 6


def before_leaving(tell):
    """tell(reason) will be called when this task ends on purpose: an error
    of its own or Ctrl-C; not SIGTERM, which a scheduler sends to a task it
    will start again, nor a crash."""
    _last_words.append(tell)


def say_last_words(reason):
    """Calls what before_leaving() set up, for LAST_WORDS_SECS at most: a
    frozen ps can block a run of TensorFlow's past its timeout."""
    def tell_all():
        for tell in _last_words:
            try:
                tell(reason)
            except Exception:  # the other tasks may be gone already
                pass
    thread = threading.Thread(target=tell_all, daemon=True)
    thread.start()
    thread.join(LAST_WORDS_SECS)


# -------------------------------------------- where the cluster comes from

def cluster_spec_from_flags():
    """The cluster, and this task's place in it, from the first of: --ps and
    --worker; TF_CONFIG (how Kubeflow's TFJob and managed services describe
    it); Slurm's variables inside a step of srun; the defaults of --ps and
    --worker."""
    given = FLAGS['ps'].present or FLAGS['worker'].present
    # An sbatch script's own shell has SLURM_PROCID too, but is no step of
    # srun: tasks started there by hand describe the cluster with flags.
    sources = [name for name, present in (
        ('--ps/--worker', given), ('TF_CONFIG', 'TF_CONFIG' in os.environ),
        ('Slurm', 'SLURM_STEP_ID' in os.environ)) if present]
    if given and len(sources) > 1:
        usage_error('both %s describe the cluster: give one'
                    % ' and '.join(sources))
    source = sources[0] if sources else 'the defaults of --ps/--worker'
    if source == 'TF_CONFIG':
        cluster = _resolve(source, _tf_config_cluster)
    elif source == 'Slurm':
        cluster = _resolve(source, _slurm_cluster)
    else:
        cluster = tf.train.ClusterSpec({'ps': parse_host_list(FLAGS.ps),
                                        'worker': parse_host_list(FLAGS.worker)})
    if sorted(cluster.jobs) != ['ps', 'worker']:
        usage_error('%s: the cluster needs jobs ps and worker (worker 0 is the '
                    'chief), not %s' % (source, ', '.join(sorted(cluster.jobs))))
    # A task that listens where the spec puts another would serve the wrong
    # devices to the tasks that come to it.
    addresses = cluster.job_tasks('ps') + cluster.job_tasks('worker')
    for address in addresses:
        if addresses.count(address) > 1:
            usage_error('%s: %s is given to two tasks' % (source, address))
    if FLAGS.job_name is None:
        usage_error('--job_name is required: ps or worker')
    tasks = cluster.num_tasks(FLAGS.job_name)
    if FLAGS.task_index >= tasks:
        usage_error('--task_index=%d, but %s lists only %d %s task(s)'
                    % (FLAGS.task_index, source, tasks, FLAGS.job_name))
    here = cluster.task_address(FLAGS.job_name, FLAGS.task_index)
    if source == 'Slurm':
        here += ' (Slurm task %s on %s)' % (os.environ['SLURM_PROCID'],
                                           os.environ.get('SLURMD_NODENAME'))
    print('%s: cluster from %s: ps %s, workers %s; this task: %s'
          % (task_name(), source, ','.join(cluster.job_tasks('ps')),
             ','.join(cluster.job_tasks('worker')), here), flush=True)
    return cluster


def _resolve(source, resolve):
    """The cluster that resolve() finds, and this task's job and index from
    it too, unless given as flags, which must agree."""
    try:
        cluster, job_name, task_index = resolve()
    except (KeyError, ValueError, RuntimeError) as e:
        usage_error('%s: %s' % (source, e))
    for name, value in (('job_name', job_name), ('task_index', task_index)):
        if FLAGS[name].present and FLAGS[name].value != value:
            usage_error('--%s=%s, but %s says %s'
                        % (name, FLAGS[name].value, source, value))
        if value is not None:
            setattr(FLAGS, name, value)
    return cluster


def _tf_config_cluster():
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    return resolver.cluster_spec(), resolver.task_type, resolver.task_id


def _slurm_cluster():
    """The tasks of this srun step where Slurm placed them: the first
    --num_ps are the ps, the rest the workers, each on its node's ports from
    --slurm_port_base up.

    Not TensorFlow's SlurmClusterResolver: it sorts the nodes by name and
    fills them in turn, while Slurm keeps its own node order (node9 before
    node10) and may deal the tasks out in turn (srun -m cyclic), so tasks
    would be given other tasks' hosts.
    """
    env = os.environ
    try:
        nodes = expand_hostlist(env['SLURM_STEP_NODELIST'])
        counts = expand_tasks_per_node(env['SLURM_STEP_TASKS_PER_NODE'])
        rank = int(env['SLURM_PROCID'])
    except KeyError as e:
        raise KeyError('%s is not set: is this a step of srun?' % e.args[0])
    distribution = re.split('[:,]', env.get('SLURM_DISTRIBUTION', ''))[0]
    placement = slurm_placement(nodes, counts, distribution or 'block')
    hosts = ['%s:%d' % (node, FLAGS.slurm_port_base
                        + placement[:i].count(node))
             for i, node in enumerate(placement)]
    here = env.get('SLURMD_NODENAME', placement[rank])
    if here != placement[rank]:
        raise ValueError(
            'task %d runs on %s, but the step\'s nodes %s with %s tasks each '
            '(distribution %s) place it on %s'
            % (rank, here, env['SLURM_STEP_NODELIST'],
               env['SLURM_STEP_TASKS_PER_NODE'], distribution or 'block',
               placement[rank]))
    if not FLAGS.num_ps < len(hosts):
        raise ValueError('--num_ps=%d leaves none of the step\'s %d tasks to '
                         'be a worker' % (FLAGS.num_ps, len(hosts)))
    cluster = tf.train.ClusterSpec({'ps': hosts[:FLAGS.num_ps],
                                    'worker': hosts[FLAGS.num_ps:]})
    if rank < FLAGS.num_ps:
        return cluster, 'ps', rank
    return cluster, 'worker', rank - FLAGS.num_ps


# One name of a Slurm host list, with its ranges: node[9-10,12]-ib.
_HOSTS = r'([\w.-]+)(?:\[(\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*)\]([\w.-]*))?'


def expand_hostlist(value):
    """Slurm's 'node[9-10,12],gpu01' -> ['node9', 'node10', 'node12',
    'gpu01'], in its order."""
    if not re.fullmatch('%s(,%s)*' % (_HOSTS, _HOSTS), value):
        raise ValueError('%r is not a Slurm host list' % value)
    hosts = []
    for prefix, ranges, suffix in re.findall(_HOSTS, value):
        if not ranges:
            hosts.append(prefix)
        for item in filter(None, ranges.split(',')):
            first, _, last = item.partition('-')
            hosts += [prefix + str(i).zfill(len(first)) + suffix
                      for i in range(int(first), int(last or first) + 1)]
    return hosts


def expand_tasks_per_node(value):
    """Slurm's '2(x3),1' -> [2, 2, 2, 1]."""
    if not re.fullmatch(r'\d+(\(x\d+\))?(,\d+(\(x\d+\))?)*', value):
        raise ValueError('%r is not a Slurm tasks-per-node list' % value)
    return [int(n) for n, times in re.findall(r'(\d+)(?:\(x(\d+)\))?', value)
            for _ in range(int(times or 1))]


def slurm_placement(nodes, counts, distribution):
    """The node of each task of a step, as Slurm places them: block fills
    each node in turn; cyclic deals one task to each node that has room left,
    round after round."""
    if len(nodes) != len(counts):
        raise ValueError('%d nodes but %d tasks-per-node counts'
                         % (len(nodes), len(counts)))
    if distribution == 'block':
        return [node for node, n in zip(nodes, counts) for _ in range(n)]
    if distribution == 'cyclic':
        return [node for round_ in range(max(counts))
                for node, n in zip(nodes, counts) if round_ < n]
    raise ValueError('tasks of distribution %s cannot be placed from the '
                     'step\'s variables: use srun -m block or -m cyclic'
                     % distribution)


# ------------------------------------------ this task's server and configs

def start_server(cluster):
    """This task's server, once what it will write is known to be writable."""
    if FLAGS.job_name == 'worker' and FLAGS.task_index == 0:
        check_logdir()
    try:
        return tf.train.Server(cluster, job_name=FLAGS.job_name,
                               task_index=FLAGS.task_index,
                               config=session_config(cluster))
    except tf.errors.UnknownError:
        address = cluster.task_address(FLAGS.job_name, FLAGS.task_index)
        fail('cannot listen on port %s (%s): is it in use?'
             % (address.rpartition(':')[2], address))


def check_logdir():
    """The chief writes --logdir: it must be a directory, or be creatable,
    and take a file; else a usage error before the chief joins the cluster.
    A write that fails later, in TensorFlow's summary thread, is one line."""
    if FLAGS.logdir is None:
        return
    probe = os.path.join(FLAGS.logdir, '.writable')
    try:
        tf.io.gfile.makedirs(FLAGS.logdir)
        with tf.io.gfile.GFile(probe, 'w') as f:
            f.write('')
        tf.io.gfile.remove(probe)
    except tf.errors.OpError as e:
        usage_error('--logdir=%s: cannot write there (%s)'
                    % (FLAGS.logdir, what_went_wrong(e)))
    threading.excepthook = _summary_writer_failed


def _summary_writer_failed(args):
    """The thread of TensorFlow's that writes the summaries ends at the
    first write that fails: one line instead of its traceback; then
    TrainingLog writes no more."""
    if type(args.thread).__name__ != '_EventLoggerThread':
        return threading.__excepthook__(args)
    logdir_failed('write summaries', args.exc_value)


def save_checkpoint(sv, sess):
    """The chief's checkpoint in --logdir; a save that fails (a full or
    broken file system) is one line, and training goes on."""
    try:
        sv.saver.save(sess, sv.save_path, global_step=sv.global_step)
    except (tf.errors.UnavailableError, tf.errors.AbortedError):
        pass  # a lost ps, which the main thread waits for
    except tf.errors.OpError as e:
        logdir_failed('save a checkpoint', e)


def logdir_failed(what, error):
    """One line for a write to --logdir that failed: a full or broken file
    system costs the chief its checkpoints or summaries, not its run."""
    print('%s: error: cannot %s in --logdir=%s (%s); training goes on'
          % (task_name(), what, FLAGS.logdir, what_went_wrong(error)),
          file=sys.stderr, flush=True)


def session_config(cluster):
    if FLAGS.job_name == 'ps':
        # The ps only holds the variables: keep it off the GPUs.
        return tf.ConfigProto(device_count={'GPU': 0})
    # Without the filter a worker's session waits for every other worker.
    return tf.ConfigProto(
        allow_soft_placement=True,
        device_filters=['/job:ps', task_name()],
        gpu_options=tf.GPUOptions(
            per_process_gpu_memory_fraction=FLAGS.gpu_memory_fraction))


# ------------------------------------------------------ each worker's data

def load_mnist(cluster, images_per_run):
    """The data sets of --data_dir, or the end of this task saying why not.
    With --shard_data, this worker's own slice of the training set."""
    try:
        mnist = mnist_data.read_data_sets(
            FLAGS.data_dir, FLAGS.validation_size, FLAGS.data_mirror)
    except mnist_data.DataError as e:
        fail(e)
    if FLAGS.shard_data:
        num_workers = cluster.num_tasks('worker')
        mnist = mnist._replace(train=mnist_data.Split(
            mnist.train.images[FLAGS.task_index::num_workers],
            mnist.train.labels[FLAGS.task_index::num_workers]))
    if len(mnist.train.images) < images_per_run:
        fail('%d training images are fewer than the %d of one session.run '
             '(--batch_size, times --steps_per_run)'
             % (len(mnist.train.images), images_per_run))
    return mnist


# ------------------------------------------------- errors of the cluster

@contextlib.contextmanager
def exit_if_cluster_lost(cluster):
    """Ends this worker with a one-line error when a ps task goes away."""
    try:
        yield
    except (tf.errors.UnavailableError, tf.errors.AbortedError) as e:
        die('error: ' + lost_connection(cluster, e))


def lost_connection(cluster, error, missing=()):
    """'lost the connection to' a ps task of `missing` (found not
    answering), else to the task that a call in the error failed to reach,
    else to another task it names, never this one, else to the ps tasks."""
    # The tasks named first may only have passed the error on: with 2 ps, a
    # live ps whose part of the step failed on the lost one.
    # Nor is this task lost: a call that this task's own server failed
    # (the ps behind it frozen) names it as the remote target.
    me = (FLAGS['job_name'].value, FLAGS['task_index'].value)

    def named(prefix):
        return [(job, int(i)) for job, i in re.findall(
            prefix + r'/job:(\w+)/replica:\d+/task:(\d+)',
            error.message if error else '') if (job, int(i)) != me]
    # Older TF, 1.15 among them, names no remote target.
    lost = ([('ps', i) for i in sorted(missing)] or named('remote target ')
            or named(''))
    if not lost:
        return 'lost the connection to a ps task (%s)' % ','.join(
            cluster.job_tasks('ps'))
    job, index = lost[0]
    return 'lost the connection to /job:%s/task:%d (%s)' % (
        job, index, cluster.task_address(job, index))


@contextlib.contextmanager
def exit_if_misplaced(cluster):
    """Ends this worker with a one-line error when the task that answers at
    an address of its cluster is not the one the cluster puts there: the
    tasks were given clusters that differ."""
    try:
        yield
    except tf.errors.InvalidArgumentError as e:
        unknown = re.search(r'/job:(\w+)/replica:\d+/task:(\d+)/\S+ unknown '
                            r'device', e.message)
        if not unknown:
            raise
        job, index = unknown.group(1), int(unknown.group(2))
        fail('cannot place the model on /job:%s/task:%d (%s): another task '
             'answers there; give every task the same cluster'
             % (job, index, cluster.task_address(job, index)))


# --------------------------------------------------- what a worker reports

class TrainingLog:
    """What a worker prints as it trains, and what the chief writes for
    TensorBoard when there is a --logdir.

    accuracy_on(split) is the model's accuracy on a split of the data.
    """

    SUMMARY_EVERY_STEPS = 50
    PROGRESS_EVERY_SECS = 10

    def __init__(self, sv, sess, global_step, accuracy_on, mnist):
        self.sv, self.sess = sv, sess
        self.accuracy_on, self.mnist = accuracy_on, mnist
        self.writing = sv.summary_writer is not None
        self.started = self.last_progress = time.time()
        self.local_step = 0
        print('worker=%d, starting at global_step=%d'
              % (FLAGS.task_index, global_step), flush=True)

    def step(self, global_step, loss, steps=1):
        """After each session.run of `steps` training steps."""
        self.local_step += steps
        every = self.SUMMARY_EVERY_STEPS
        if self.writing and self.local_step % every < steps:
            self._summary(global_step, loss=loss)
        if time.time() - self.last_progress >= self.PROGRESS_EVERY_SECS:
            self.last_progress = time.time()
            print('worker=%d, global_step=%d, local_step=%d, %.0f steps/s'
                  % (FLAGS.task_index, global_step, self.local_step,
                     self.local_step / (self.last_progress - self.started)),
                  flush=True)

    def epoch(self, epoch, global_step, loss):
        """After each whole epoch: the book's line."""
        if (epoch + 1) % FLAGS.print_every_epochs:
            return
        print('worker=%d,epoch=%d,global_step=%d, local_step=%d, loss=%s'
              % (FLAGS.task_index, epoch, global_step, self.local_step,
                 float(loss)), flush=True)
        if self.writing:
            self._summary(
                global_step,
                validation_accuracy=self.accuracy_on(self.mnist.validation),
                test_accuracy=self.accuracy_on(self.mnist.test))

    def final(self, global_step, accuracy):
        """How long and fast this worker trained, after its final test
        accuracy."""
        seconds = time.time() - self.started
        print('worker=%d, local_steps=%d, global_step=%d, train_seconds=%.1f, '
              'steps_per_sec=%.1f' % (FLAGS.task_index, self.local_step,
                                      global_step, seconds,
                                      self.local_step / seconds), flush=True)
        if self.writing:
            self._summary(global_step, test_accuracy=accuracy)

    def _summary(self, global_step, **values):
        try:
            self.sv.summary_computed(self.sess, tf.Summary(value=[
                tf.Summary.Value(tag=tag, simple_value=value)
                for tag, value in values.items()]), global_step=global_step)
        except RuntimeError:  # its writer's thread failed, and said so
            self.writing = False


# ----------------------------------------------------------------- signals

def exit_on_signals():
    """Ctrl-C (SIGINT) and SIGTERM end this task at once, with one line and
    status 130 or 143, wherever it is, inside sess.run too. Ctrl-C ends it
    on purpose, and the cluster is told; SIGTERM is what a scheduler sends
    to a task it may start again, and the cluster waits for it.

    Python runs its handlers in the main thread only, between bytecodes:
    never while that thread waits in TensorFlow's C++. The signal number
    that Python's C handler writes to the wakeup pipe, whichever thread the
    signal reached, is read by a thread of ours at once.
    """
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    signal.set_wakeup_fd(write_end)
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: None)  # the pipe's reader acts

    def end():
        signum = os.read(read_end, 1)[0]
        die('interrupted', 128 + signum, on_purpose=signum == signal.SIGINT)

    threading.Thread(target=end, daemon=True).start()


# ----------------------------------------------------------- end of a task

def leave():
    """Ends this task at once, with status 0, once all is said and closed.

    TensorFlow cannot stop its gRPC server, and tearing the interpreter down
    around it takes a second or more for nothing.
    """
    _end_once()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)

