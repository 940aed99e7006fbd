"""What mnist_dist_async.py and mnist_dist_sync.py share.

Flags, the ClusterSpec and the server of this task, session configs, loading
the MNIST data (mnist_data.py), the model and the end of a run: once every
worker has finished, each ps task leaves on its own instead of blocking in
`server.join()`.
"""

import collections
import contextlib
import os
import re
import socket
import sys
import time

# TensorFlow prints pages of C++ start-up lines; keep warnings and errors only.
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import tensorflow.compat.v1 as tf  # noqa: E402
from absl import flags  # noqa: E402

import mnist_data  # noqa: E402

tf.logging.set_verbosity(tf.logging.ERROR)
tf.disable_v2_behavior()

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
flags.DEFINE_integer('num_ps', 1, 'Under Slurm: how many of its tasks are ps '
                     'tasks (the first ones).', lower_bound=1)
flags.DEFINE_integer('slurm_port_base', 8888,
                     'Under Slurm: the port of the first task on each node.',
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
flags.DEFINE_float('learning_rate', 0.01, 'Learning rate of gradient descent.')
flags.DEFINE_integer('batch_size', 100, 'Images per training step.',
                     lower_bound=1)
flags.DEFINE_integer('epochs', 50,
                     'Passes of each worker over the training set.',
                     lower_bound=1)
flags.DEFINE_integer('print_every_epochs', 10,
                     'Log the loss every this many epochs.', lower_bound=1)
flags.DEFINE_float('gpu_memory_fraction', 0.2,
                   'Share of a GPU\'s memory each worker may take, so that '
                   'several workers fit on one GPU.')
flags.DEFINE_string('logdir', None,
                    'Where the chief writes summaries for TensorBoard and '
                    'checkpoints; a run with the same logdir resumes from '
                    'the last checkpoint. Nothing is written without it.')
flags.DEFINE_integer('step_delay_ms', 0,
                     'Sleep this long after each step: a straggler on '
                     'purpose, for bench.py.', lower_bound=0)
flags.DEFINE_float('startup_timeout', 120,
                   'Seconds to wait for the other tasks to come up.')
flags.register_validator('learning_rate', lambda v: v > 0,
                         'must be positive')
flags.register_validator('gpu_memory_fraction', lambda v: 0 < v <= 1,
                         'must be in (0, 1]')
flags.register_validator('startup_timeout', lambda v: v > 0,
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
    hosts = []
    for job in ('ps', 'worker'):
        try:
            hosts += parse_host_list(values[job])
        except ValueError as e:
            raise flags.ValidationError('--%s: %s' % (job, e))
    for host in hosts:
        if hosts.count(host) > 1:
            raise flags.ValidationError('%s is given to two tasks' % host)
    return True


def parse_flags(argv):
    """absl's parser, but a usage error is one line and exit status 2."""
    try:
        return FLAGS(argv)
    except flags.Error as e:
        usage_error(e)


def usage_error(message):
    print('%s: error: %s' % (os.path.basename(sys.argv[0]), message),
          file=sys.stderr)
    sys.exit(2)


def fail(message):
    """Ends this task with a one-line error and exit status 1."""
    print('%s: error: %s' % (task_name(), message), file=sys.stderr)
    sys.exit(1)


def task_name():
    return '/job:%s/task:%d' % (FLAGS.job_name, FLAGS.task_index)


def cluster_spec_from_flags():
    """The cluster, and this task's place in it, from the first of: --ps and
    --worker; TF_CONFIG (how Kubeflow's TFJob and managed services describe
    it); Slurm's variables under srun; the defaults of --ps and --worker."""
    given = FLAGS['ps'].present or FLAGS['worker'].present
    sources = [name for name, present in (
        ('--ps/--worker', given), ('TF_CONFIG', 'TF_CONFIG' in os.environ),
        ('Slurm', 'SLURM_PROCID' in os.environ)) if present]
    if given and len(sources) > 1:
        usage_error('both %s describe the cluster: give one'
                    % ' and '.join(sources))
    source = sources[0] if sources else 'the defaults of --ps/--worker'
    if source == 'TF_CONFIG':
        cluster = _resolve(
            source, tf.distribute.cluster_resolver.TFConfigClusterResolver)
    elif source == 'Slurm':
        cluster = _resolve(source, _slurm_resolver)
    else:
        cluster = tf.train.ClusterSpec({'ps': parse_host_list(FLAGS.ps),
                                        'worker': parse_host_list(FLAGS.worker)})
    if sorted(cluster.jobs) != ['ps', 'worker']:
        usage_error('%s: the cluster needs jobs ps and worker (worker 0 is the '
                    'chief), not %s' % (source, ', '.join(sorted(cluster.jobs))))
    if FLAGS.job_name is None:
        usage_error('--job_name is required: ps or worker')
    tasks = cluster.num_tasks(FLAGS.job_name)
    if FLAGS.task_index >= tasks:
        usage_error('--task_index=%d, but %s lists only %d %s task(s)'
                    % (FLAGS.task_index, source, tasks, FLAGS.job_name))
    print('%s: cluster from %s: ps %s, workers %s'
          % (task_name(), source, ','.join(cluster.job_tasks('ps')),
             ','.join(cluster.job_tasks('worker'))), flush=True)
    return cluster


def _resolve(source, make_resolver):
    """The cluster that a TensorFlow cluster resolver finds, and this task's
    job and index from it too, unless given as flags, which must agree."""
    try:
        resolver = make_resolver()
        cluster = resolver.cluster_spec()
    except (KeyError, ValueError, RuntimeError) as e:
        usage_error('%s: %s' % (source, e))
    for name, value in (('job_name', resolver.task_type),
                        ('task_index', resolver.task_id)):
        if FLAGS[name].present and FLAGS[name].value != value:
            usage_error('--%s=%s, but %s says %s'
                        % (name, FLAGS[name].value, source, value))
        if value is not None:
            setattr(FLAGS, name, value)
    return cluster


def _slurm_resolver():
    """TensorFlow's resolver for the tasks of this srun: the first --num_ps
    are the ps, the rest the workers."""
    num_tasks = int(os.environ.get('SLURM_STEP_NUM_TASKS',
                                   os.environ.get('SLURM_NTASKS', 0)))
    jobs = {'ps': FLAGS.num_ps, 'worker': num_tasks - FLAGS.num_ps}
    resolver = tf.distribute.cluster_resolver.SlurmClusterResolver
    if tf.config.experimental.list_physical_devices('GPU'):
        return resolver(jobs=jobs, port_base=FLAGS.slurm_port_base)
    # It hands out ports by GPU: on a node without one, give it a slot per
    # task, and keep it from setting CUDA_VISIBLE_DEVICES.
    return resolver(jobs=jobs, port_base=FLAGS.slurm_port_base,
                    gpus_per_node=num_tasks, gpus_per_task=1,
                    auto_set_gpu=False)


def start_server(cluster):
    try:
        return tf.train.Server(cluster, job_name=FLAGS.job_name,
                               task_index=FLAGS.task_index,
                               config=session_config(cluster))
    except tf.errors.UnknownError:
        address = cluster.task_address(FLAGS.job_name, FLAGS.task_index)
        fail('cannot listen on port %s (%s): is it in use?'
             % (address.rpartition(':')[2], address))


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


# -------------------------------------------------------------------- data

def load_mnist(cluster):
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
    if len(mnist.train.images) < FLAGS.batch_size:
        fail('%d training images are fewer than --batch_size=%d'
             % (len(mnist.train.images), FLAGS.batch_size))
    return mnist


# ------------------------------------------------------------------- model

Model = collections.namedtuple('Model', ['x', 'y_', 'loss', 'accuracy'])


def softmax_regression():
    """The book's model: softmax regression of the 784 pixels."""
    x = tf.placeholder(tf.float32, [None, mnist_data.IMAGE_PIXELS], name='x')
    y_ = tf.placeholder(tf.float32, [None, mnist_data.NUM_CLASSES], name='y_')
    w = tf.Variable(tf.random_normal(
        [mnist_data.IMAGE_PIXELS, mnist_data.NUM_CLASSES]), name='w')
    b = tf.Variable(tf.random_normal([mnist_data.NUM_CLASSES]), name='b')
    logits = tf.matmul(x, w) + b
    loss = tf.reduce_mean(
        tf.nn.softmax_cross_entropy_with_logits_v2(labels=y_, logits=logits))
    correct = tf.equal(tf.argmax(logits, 1), tf.argmax(y_, 1))
    return Model(x, y_, loss, tf.reduce_mean(tf.cast(correct, tf.float32)))


class TrainingLog:
    """What a worker prints as it trains, and what the chief writes for
    TensorBoard when there is a --logdir."""

    SUMMARY_EVERY_STEPS = 50
    PROGRESS_EVERY_SECS = 10

    def __init__(self, sv, sess, model, mnist, global_step):
        self.sv, self.sess, self.model, self.mnist = sv, sess, model, mnist
        self.writing = sv.summary_writer is not None
        self.started = self.last_progress = time.time()
        self.local_step = 0
        print('worker=%d, starting at global_step=%d'
              % (FLAGS.task_index, global_step), flush=True)

    def step(self, global_step, loss):
        """After each training step."""
        self.local_step += 1
        if FLAGS.step_delay_ms:
            time.sleep(FLAGS.step_delay_ms / 1000)
        if self.writing and self.local_step % self.SUMMARY_EVERY_STEPS == 0:
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
                validation_accuracy=self._accuracy(self.mnist.validation),
                test_accuracy=self._accuracy(self.mnist.test))

    def final(self, global_step):
        """Test accuracy, and how long and fast this worker trained."""
        seconds = time.time() - self.started
        accuracy = self._accuracy(self.mnist.test)
        print('worker=%d, final accuracy = %s'
              % (FLAGS.task_index, float(accuracy)), flush=True)
        print('worker=%d, local_steps=%d, global_step=%d, train_seconds=%.1f, '
              'steps_per_sec=%.1f' % (FLAGS.task_index, self.local_step,
                                      global_step, seconds,
                                      self.local_step / seconds), flush=True)
        if self.writing:
            self._summary(global_step, test_accuracy=accuracy)

    def _accuracy(self, split):
        return self.sess.run(self.model.accuracy, feed_dict={
            self.model.x: split.images, self.model.y_: split.labels})

    def _summary(self, global_step, **values):
        self.sv.summary_computed(self.sess, tf.Summary(value=[
            tf.Summary.Value(tag=tag, simple_value=value)
            for tag, value in values.items()]), global_step=global_step)


# ---------------------------------------------------------------- liveness

def is_listening(address, timeout=1.0):
    host, _, port = address.rpartition(':')
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return True
    except OSError:
        return False


def wait_for_tasks(cluster, job):
    """Blocks until every task of `job` accepts connections."""
    deadline = time.time() + FLAGS.startup_timeout
    addresses = cluster.job_tasks(job)
    missing = set(range(len(addresses)))
    while missing:
        missing = {i for i in missing if not is_listening(addresses[i])}
        fail_if_late(job, addresses, missing, deadline)
        if missing:
            time.sleep(0.2)


def fail_if_late(job, addresses, missing, deadline):
    """Ends this task, naming the first of the missing tasks of `job`, once
    the deadline has passed."""
    if missing and time.time() > deadline:
        i = min(missing)
        fail('/job:%s/task:%d (%s) did not come up within %g s'
             % (job, i, addresses[i], FLAGS.startup_timeout))


def supervised_session(sv, server, cluster):
    """The Supervisor's session, once the ps tasks and the chief are up."""
    wait_for_tasks(cluster, 'ps')
    with exit_if_cluster_lost(cluster):
        try:
            return sv.prepare_or_wait_for_session(
                server.target, config=session_config(cluster),
                max_wait_secs=FLAGS.startup_timeout)
        except tf.errors.DeadlineExceededError:
            fail('the chief, /job:worker/task:0 (%s), did not initialize the '
                 'model within %g s' % (cluster.task_address('worker', 0),
                                        FLAGS.startup_timeout))


def close_session(sv, sess):
    """Ends a worker's session and the Supervisor's threads.

    The threads are told to stop first, then the session is closed, which
    cancels what they are blocked in, such as the sync chief's wait for
    gradients that no worker will send any more; only then can they be joined.
    """
    if sv.save_path:  # the chief, with a --logdir: a last checkpoint
        sv.saver.save(sess, sv.save_path, global_step=sv.global_step)
    sv.request_stop()
    sess.close()
    sv.stop()


def leave():
    """Ends this task at once, with status 0, once all is said and closed.

    TensorFlow cannot stop its gRPC server, and tearing the interpreter down
    around it takes a second or more for nothing.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


@contextlib.contextmanager
def exit_if_cluster_lost(cluster):
    """Ends this worker with a one-line error when a ps task goes away.

    At once, with os._exit: closing a session whose ps is gone blocks for
    good, and so would the interpreter's own clean-up.
    """
    try:
        yield
    except (tf.errors.UnavailableError, tf.errors.AbortedError) as e:
        # The message names the tasks involved, this one among them.
        named = re.findall(r'/job:(\w+)/replica:\d+/task:(\d+)', e.message)
        others = [(job, int(i)) for job, i in named
                  if (job, int(i)) != (FLAGS.job_name, FLAGS.task_index)]
        task = 'a ps task (%s)' % ','.join(cluster.job_tasks('ps'))
        if others:
            job, index = others[0]
            task = '/job:%s/task:%d (%s)' % (
                job, index, cluster.task_address(job, index))
        print('%s: error: lost the connection to %s'
              % (task_name(), task), file=sys.stderr, flush=True)
        os._exit(1)


# ------------------------------------------------------------ end of a run

def serve_until_workers_gone(cluster):
    """The ps side of the end of a run: serve until every worker has come up
    and gone.

    Instead of server.join(), which never returns. The ps watches the workers'
    ports rather than waiting for messages from them: a worker still needs the
    ps while it closes its session, and one that was killed sends nothing.
    A worker that never comes up ends the ps after --startup_timeout.
    """
    workers = cluster.job_tasks('worker')
    deadline = time.time() + FLAGS.startup_timeout
    seen = set()
    while True:
        up = {i for i, address in enumerate(workers) if is_listening(address)}
        seen |= up
        if not up and len(seen) == len(workers):
            return
        fail_if_late('worker', workers, set(range(len(workers))) - seen,
                     deadline)
        time.sleep(0.2)
