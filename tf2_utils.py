"""The cluster side of mnist_dist_tf2.py, on cluster_utils.py's flags and
task: this task in TensorFlow 2's cluster, and what its coordinator adds
to TensorFlow's own (TensorFlow 2 only: the TF1 scripts do not import
it)."""

import contextlib
import os
import sys
import threading
import time
import traceback

import tensorflow as tf
from absl import flags

import cluster_utils
import mnist_data
from ps_cluster import errors, exits, liveness, probes
from ps_cluster.tf2 import coordinated
from ps_cluster.deadlines import call_within, in_thread, poll
from ps_cluster.exits import TaskFailed
from ps_cluster.logdir import CHIEF_DONE, CHIEF_LEFT, Logdir
from ps_cluster.worker.training_log import time_left

FLAGS = flags.FLAGS
# How many times in a row the coordinator starts again, each after twice
# the wait of the one before, from a second: a ps lost again at once, five
# times, is no longer one a scheduler brings back. Counted across its
# process images in the environment; an epoch done ends the row.
RESTARTS, RESTARTS_VARIABLE = 5, 'MNIST_DIST_TF2_RESTARTS'


def start_task():
    """This task (a Tf2Task) of TensorFlow 2's cluster, set to end in one
    line as the TF1 scripts' tasks are (cluster_utils.start_task())."""
    return Tf2Task(cluster_utils.start_task(sync=False, coordinator=True))


class Tf2Task:
    """This task in TensorFlow 2's cluster: worker 0 of the TF1 scripts'
    cluster is its chief, the coordinator, and worker i its worker i - 1.
    `cluster` (a ClusterSpec), `job_name`, `index`, and `task_index`, its
    --task_index, which the lines it prints for launch_local.sh carry."""

    # How often the coordinator asks its workers whether they answer, while
    # it waits for their steps.
    WORKER_CHECK_SECS = 2
    # How long the coordinator tries to tell its servers it is done.
    DONE_SECS = 30

    def __init__(self, task):
        self.task, self.end = task, task.end
        workers = task.cluster['worker']
        if task.job_name == 'evaluator' and FLAGS.split_w:
            exits.usage_error('--split_w: an evaluator reads w whole, and '
                              'TensorFlow 2 checkpoints its shards apart')
        if FLAGS.shard_data:
            exits.usage_error('--shard_data: mnist_dist_tf2.py\'s workers '
                              'read the coordinator\'s data, all of it')
        if len(workers) < 2:
            exits.usage_error('--worker lists %d task(s): TensorFlow 2 needs '
                              'a coordinator, worker 0, and a worker to '
                              'train' % len(workers))
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
        # The workers said not to answer, and when each last answered.
        self._gone, self._heard = set(), {}
        self._checked = time.monotonic()
        task.end.name = lambda: self.name
        print('%s: TensorFlow 2\'s cluster: chief %s (the coordinator), '
              'workers %s, ps %s' % (
                  self.name, workers[0], ','.join(workers[1:]),
                  ','.join(task.cluster['ps'])), flush=True)
        # Only the coordinator can tell the others why it ends; TensorFlow
        # 2's servers cannot tell it. An evaluator follows its word in
        # --logdir/tf2.
        self.saved = self.markers = None
        task.end.before_leaving(self._tell_servers
                                if self.job_name == 'chief' else None)
        if self.job_name == 'chief':
            # Its eager runtime would take the whole of every GPU it sees
            # at its first op: it sees only its own, if --gpu_jobs gives it
            # one, and takes that as it needs it.
            gpus = tf.config.list_physical_devices('GPU')
            mine = [] if task.gpu is None else gpus[task.gpu:task.gpu + 1]
            tf.config.set_visible_devices(mine, 'GPU')
            for gpu in mine:
                tf.config.experimental.set_memory_growth(gpu, True)
            if FLAGS.logdir:
                self.markers = Logdir(os.path.join(FLAGS.logdir, 'tf2'),
                                      self.name)
            task.end.on_preemption(self._preempted, FLAGS.preemption_grace)
            self._end_on_errors()

    def load_mnist(self, images_per_step):
        """The data sets of --data_dir (cluster_utils.Task.load_mnist), once
        --logdir takes a file."""
        self.task.check_logdir()
        if self.markers:
            self.markers.forget_ended()
        return self.task.load_mnist(images_per_step)

    def evaluate(self, model, mnist, last_step):
        """An evaluator beside the run, as the TF1 scripts' (cluster_utils'
        Task.evaluate()): each new checkpoint of the coordinator's, in
        --logdir/tf2, which a TF1 Saver restores by its variables' names,
        measured until the run's last. It ends the task."""
        def graph_model(images):
            return model(images, tf.compat.v1.get_variable(
                'w', [mnist_data.IMAGE_PIXELS, mnist_data.NUM_CLASSES]),
                tf.compat.v1.get_variable('b', [mnist_data.NUM_CLASSES]))
        self.task.evaluate(graph_model, loss_and_accuracy, mnist, last_step,
                           os.path.join(FLAGS.logdir, 'tf2'))

    def serve(self, server):
        """server.join() for a ps or worker, but it ends once the
        coordinator has: with status 0 once it said why (one line if it did
        not finish), 1 if it stays silent for --worker_timeout. It ends
        the task."""
        self.task.check_gpu(server, self.job_name, self.index)
        word = coordinated.Word(server, self.name)
        if self.job_name == 'ps':
            self.end.on_preemption(
                lambda: word.preempted(FLAGS.preemption_grace),
                FLAGS.preemption_grace)
        word = word.wait(self._coordinator(), FLAGS.startup_timeout,
                         FLAGS.worker_timeout, self._tasks('ps'))
        if word != coordinated.DONE:
            print('%s: the coordinator, %s (%s), left: "%s"' % (
                self.name, *self._coordinator(), word), flush=True)
        self.end.leave()

    def wait_for_servers(self):
        """Until every ps and worker answers, or TaskFailed naming those
        that do not after --startup_timeout: TensorFlow 2's strategy
        connects to all of them at once, and its first steps fail on a ps
        not yet up."""
        servers = (self.cluster.job_tasks('ps')
                   + self.cluster.job_tasks('worker'))
        if not poll(lambda: all(map(probes.answers, servers)),
                    FLAGS.startup_timeout, 0.2):
            raise TaskFailed('%s within %g s' % (
                self._silent() or 'not every task answered',
                FLAGS.startup_timeout))

    def checkpoints(self, **variables):
        """TensorFlow 2's checkpoints of variables in --logdir/tf2, from
        which a run with the same --logdir goes on; where there is none, a
        TF1 script's in --logdir, read by name, is restored instead (with
        any split of w). Returns a Checkpoints."""
        self.saved = Checkpoints(FLAGS.logdir, variables, self.name)
        return self.saved

    def _preempted(self):
        """The coordinator's SIGTERM: its checkpoint of the variables as
        they stand, its servers told to wait for it, and its line."""
        word = (self.saved.save_now(self._read_secs()) if self.saved
                else 'saved nothing: it had not started')
        self._tell_servers('%s; the coordinator %s' % (coordinated.PREEMPTED,
                                                       word))
        print('worker=%d: preempted: %s' % (self.task_index, word),
              flush=True)

    @staticmethod
    def _read_secs():
        """How long a preemption's save tries to read the variables, a
        quarter of --preemption_grace: after a network cut, even one that
        healed, a connection may carry no call for minutes."""
        return FLAGS.preemption_grace / 4

    def _check_preempted(self):
        """A ps that says it was preempted: the coordinator saves, and tells
        it, which then leaves; the steps on it fail, and the coordinator
        starts again once it is back."""
        for name, address in self._tasks('ps').items():
            if coordinated.read(name, address) == coordinated.PREEMPTED:
                word = self.saved.save_now(self._read_secs())
                print('worker=%d: %s (%s) was preempted: %s' % (
                    self.task_index, name, address, word), flush=True)
                coordinated.tell({name: address}, '%s; the coordinator %s'
                                 % (coordinated.PREEMPTED, word),
                                 exits.TaskEnd.LAST_WORDS_SECS)

    def join(self, coordinator):
        """coordinator.join(), saying once which workers stop answering
        (TensorFlow's coordinator runs their steps on the others) and
        which come back; but the end of the task, naming the tasks that do
        not answer, once the global step has not moved for
        --stall_timeout. The global step is read meanwhile, and, with
        --logdir, the variables, for a save that cannot read them
        (Checkpoints.follow()). A step's error is raised here."""
        joined = []

        def join():
            try:
                coordinator.join()
                joined.append(None)
            except Exception as e:  # raised again in the main thread
                joined.append(e)
        threading.Thread(target=join, daemon=True, name='join').start()
        # One read at a time, however long it takes (a bigger model, a slow
        # link): a frozen ps blocks one for good.
        reading, last, moved = None, None, time.monotonic()
        while True:
            done = poll(lambda: joined, self.WORKER_CHECK_SECS, 0.05)
            # Every WORKER_CHECK_SECS, however short each join.
            if time.monotonic() - self._checked >= self.WORKER_CHECK_SECS:
                self._check_workers()
                self._check_preempted()
            if done:
                break
            if reading is not None and reading.done():
                failure = reading.exception()
                if not isinstance(failure, (type(None), tf.errors.OpError)):
                    raise failure
                step = None if failure else reading.result()
                if step is not None and step != last:
                    last, moved = step, time.monotonic()
                reading = None
            if reading is None:
                reading = in_thread(self.saved.follow)
            if time.monotonic() - moved > FLAGS.stall_timeout:
                raise TaskFailed('no new global step for %g s '
                                 '(--stall_timeout); %s' % (
                                     FLAGS.stall_timeout,
                                     self._silent() or 'every task answers'))
        if joined[0] is not None:
            raise joined[0]
        os.environ.pop(RESTARTS_VARIABLE, None)

    def within(self, function, *args):
        """function(*args), a call into the cluster; or, once it has taken
        --stall_timeout (a frozen ps blocks it for good), TaskFailed naming
        the tasks that do not answer."""
        try:
            return call_within(FLAGS.stall_timeout, function, *args)
        except TimeoutError:
            raise TaskFailed('no answer for %g s (--stall_timeout); %s' % (
                FLAGS.stall_timeout, self._silent() or 'every task answers'))

    def _end_on_errors(self):
        """An error of TensorFlow's that the coordinator's main thread
        raises, in a step or as it reads or saves the variables, ends it in
        one line; but after an error of a lost ps, the ps tasks are waited
        for, --ps_timeout, and the coordinator starts again: TensorFlow 2's
        coordinator cannot make the variables again on a ps that lost
        them."""
        one_line = sys.excepthook

        def on_error(kind, error, trace):
            if self.end.ending():
                # The others, told, leave: what fails then says nothing,
                # and the thread that ends the task ends the process.
                threading.Event().wait()
            try:
                # A lost worker's steps TensorFlow's coordinator runs again
                # on the others: a lost ps is the one to recover from.
                if errors.is_ps_failure(error):
                    self._start_again(error)
                if issubclass(kind, ValueError) and (
                        'Mismatched number of GPUs' in str(error)):
                    raise TaskFailed('the workers see different numbers of '
                                     'GPUs, which TensorFlow 2\'s strategy '
                                     'cannot use: one each, or none '
                                     '(--gpu_jobs)')
            except TaskFailed as e:
                if FLAGS.tracebacks:
                    traceback.print_exception(kind, error, trace)
                self.end.fail(e.message, e.status)
            one_line(kind, error, trace)
        sys.excepthook = on_error

    def _check_workers(self):
        """Says once that a worker stopped answering, silent for GONE_SECS
        (a busy machine's worker answers late), and once that it is
        back."""
        now = self._checked = time.monotonic()
        for name, address in self._tasks('worker').items():
            self._heard.setdefault(name, now)
            if probes.answers(address):
                self._heard[name] = now
                if name in self._gone:
                    self._gone.discard(name)
                    print('worker=%d: %s (%s) is back' % (
                        self.task_index, name, address), flush=True)
            elif (name not in self._gone
                  and now - self._heard[name] > liveness.GONE_SECS):
                self._gone.add(name)
                print('worker=%d: %s (%s) does not answer: its steps go to '
                      'the other workers' % (self.task_index, name, address),
                      flush=True)

    def log(self, start, steps_per_epoch):
        """What the coordinator prints beyond the epoch lines, how far the
        run is among them, and writes in --logdir for TensorBoard."""
        return Log(self.task_index, start, FLAGS.logdir, self.name,
                   FLAGS.epochs, steps_per_epoch)

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
        """Tells the ps tasks and workers the run is done, and an evaluator
        its last checkpoint, and ends this task, status 0."""
        # Not in a hurry: a busy machine's servers answer late.
        untold = self._tell_servers(coordinated.DONE, self.DONE_SECS)
        if untold:
            print('%s: could not tell %s within %g s that the run is done; '
                  'each waits for it --worker_timeout, then fails'
                  % (self.name, ', '.join(untold), self.DONE_SECS),
                  flush=True)
        if self.markers and self.saved.last is not None:
            self.markers.say(CHIEF_DONE, str(self.saved.last))
        self.end.leave()

    def _coordinator(self):
        return '/job:chief/task:0', self.cluster.task_address('chief', 0)

    def _tasks(self, job):
        return {'/job:%s/task:%d' % (job, i): address for i, address in
                enumerate(self.cluster.job_tasks(job))}

    def _tell_servers(self, word, secs=exits.TaskEnd.LAST_WORDS_SECS):
        # An evaluator waits for a coordinator that was preempted.
        if self.markers and word != coordinated.DONE and not word.startswith(
                coordinated.PREEMPTED):
            self.markers.say(CHIEF_LEFT, word)
        servers = {**self._tasks('ps'), **self._tasks('worker')}
        return coordinated.tell(servers, word, secs)

    def _silent(self):
        """Which ps tasks and workers do not answer, in words."""
        silent = [name for name, _ in self._not_answering('ps', 'worker')]
        return silent and '%s do(es) not answer' % ', '.join(silent)

    def _not_answering(self, *jobs):
        """The (name, address) of each task of jobs that does not
        answer."""
        return [(name, address) for job in jobs
                for name, address in self._tasks(job).items()
                if not probes.answers(address)]

    def _start_again(self, error):
        """Waits for every ps to answer, and starts this coordinator again,
        as a new process image with the same arguments, from its last
        checkpoint in --logdir, if any (else from new variables, as a TF1
        run without one); or raises TaskFailed once --ps_timeout has
        passed."""
        silent = self._not_answering('ps')
        if silent:
            print('worker=%d: lost the connection to %s (%s): waiting up to '
                  '%g s for it to come back (--ps_timeout)' % (
                      self.task_index, *silent[0], FLAGS.ps_timeout),
                  flush=True)
        else:  # a ps started again in the meantime
            print('worker=%d: lost a ps task (%s); every ps answers' % (
                self.task_index, errors.what_went_wrong(error)), flush=True)
        for name, address in silent:
            if not poll(lambda: probes.answers(address), FLAGS.ps_timeout, 1):
                raise TaskFailed('lost the connection to %s (%s), which did '
                                 'not come back within %g s (--ps_timeout)'
                                 % (name, address, FLAGS.ps_timeout))
        restart = int(os.environ.get(RESTARTS_VARIABLE, 0)) + 1
        if restart > RESTARTS:
            raise TaskFailed('lost a ps task %d times in a row, without an '
                             'epoch between: %s' % (
                                 RESTARTS, errors.what_went_wrong(error)))
        print('worker=%d: starting again (%d of %d times in a row) in %d s, '
              'from the last checkpoint in --logdir if there is one'
              % (self.task_index, restart, RESTARTS, 2 ** (restart - 1)),
              flush=True)
        time.sleep(2 ** (restart - 1))
        os.environ[RESTARTS_VARIABLE] = str(restart)
        os.execv(sys.executable, [sys.executable] + sys.argv)


def loss_and_accuracy(logits, labels):
    """The book's loss and accuracy, in a TF1 graph (an evaluator's), of
    the logits against one-hot labels."""
    loss = tf.reduce_mean(tf.nn.softmax_cross_entropy_with_logits(
        labels=labels, logits=logits))
    right = tf.equal(tf.argmax(logits, 1), tf.argmax(labels, 1))
    return loss, tf.reduce_mean(tf.cast(right, tf.float32))


class Checkpoints:
    """The coordinator's checkpoints in logdir/tf2 (tf.train.Checkpoint and
    CheckpointManager), the variables restored from the last one, or from
    a TF1 run's in logdir; `source` says which, if any; `name` is the
    coordinator's, in its lines."""

    def __init__(self, logdir, variables, name):
        self.source = 'new variables'
        self.manager = self.last = self.values = None
        # One save at a time, of the shared copies: the epoch's, and a
        # preemption's from another thread; the values last read, which
        # the join's reads write too.
        self._saving, self._kept = threading.Lock(), threading.Lock()
        self.logdir, self.variables = logdir, variables
        # A write that fails, in one line: Logdir.failed.
        self.failed = Logdir(logdir, name).failed
        if not logdir:
            return
        checkpoint = tf.train.Checkpoint(**variables)
        # Saved from copies on the coordinator: TensorFlow saves variables
        # of several tasks in a tf.function traced anew each time, and its
        # registration on every task holds the GIL, for good on a frozen ps.
        # Named as the variables: an evaluator's TF1 Saver reads by name.
        self.copies = {name: tf.Variable(tf.zeros(v.shape, v.dtype),
                                         name=name)
                       for name, v in variables.items()}
        self.manager = tf.train.CheckpointManager(
            tf.train.Checkpoint(**self.copies), os.path.join(logdir, 'tf2'),
            max_to_keep=5)
        tf1 = tf.train.latest_checkpoint(logdir)
        if self.manager.latest_checkpoint:
            latest = self.manager.latest_checkpoint
            checkpoint.restore(latest).assert_consumed()
            self.source = 'the checkpoint %s' % latest
        elif tf1:
            # Not tf.train.Checkpoint's name-based restore: it matches a
            # variable by its name in the graph, and a split w's shards are
            # w/part_0, ... there but one tensor w in a TF1 checkpoint.
            reader = tf.train.load_checkpoint(tf1)
            for name, variable in variables.items():
                variable.assign(reader.get_tensor(name))
            self.source = 'the TF1 checkpoint %s' % tf1
        # The model as this process starts it, kept as the first read: a
        # preemption's save that cannot read it before the join's first
        # read (a network cut as it starts) saves this, which the
        # checkpoint it came from holds already.
        if self.manager.latest_checkpoint:
            self.last = int(
                self.manager.latest_checkpoint.rpartition('-')[2])
        with contextlib.suppress(tf.errors.OpError):
            self.read()

    def read(self):
        """The variables as they stand, read once each, the global step
        first (the model holds at least its updates), and kept unless a
        read of a later step was kept meanwhile: a save that cannot read
        them (a ps behind a broken connection) saves those. Returns
        them."""
        values = {name: tf.convert_to_tensor(self.variables[name]).numpy()
                  for name in sorted(self.variables,
                                     key=lambda name: name != 'global_step')}
        with self._kept:
            if self.values is None or (values['global_step']
                                       >= self.values['global_step']):
                self.values = values
        return values

    def follow(self):
        """The global step as it stands, read alone; with a logdir, the
        variables too, kept (read()) for a save that cannot read them."""
        if self.manager:
            return int(self.read()['global_step'])
        return int(tf.convert_to_tensor(self.variables['global_step']).numpy())

    def save(self):
        """A checkpoint of the variables as they stand, named after the
        global step it holds, which it returns. One that cannot be written
        (a full disk) is one line, and training goes on: None; a ps that
        cannot be read raises."""
        if not self.manager:
            return None
        values = self.read()
        with self._saving:
            try:
                return self._write(values)
            except (tf.errors.OpError, OSError) as e:
                self.failed('save a checkpoint', e)
                return None

    def save_now(self, read_secs):
        """A checkpoint for a preemption, from the signals' thread or as a
        ps is preempted: of the variables as they stand, or, if they cannot
        be read within read_secs, as they were last read (follow(), as
        Tf2Task.join() waits); says what it saved."""
        if not self.manager:
            return 'has no --logdir to save the model in'
        how = ''
        try:
            values = call_within(read_secs, self.read)
        except (TimeoutError, tf.errors.OpError) as e:
            with self._kept:
                values = self.values
            if values is None:
                return self._lost(errors.what_went_wrong(e))
            how = ' as last read (%s)' % errors.what_went_wrong(e)
        if not self._saving.acquire(timeout=Logdir.LOCK_SECS):
            return self._lost('the save before has not ended within %g s'
                              % Logdir.LOCK_SECS)
        try:
            step = self._write(values)
        except (tf.errors.OpError, OSError) as e:
            return self._lost(errors.what_went_wrong(e))
        finally:
            self._saving.release()
        return 'saved the model at global_step=%d%s' % (step, how)

    def _lost(self, why):
        return ('cannot save the model in --logdir=%s (%s): its steps since '
                'the last checkpoint are lost' % (self.logdir, why))

    def _write(self, values):
        """The checkpoint of values, through the copies, unless that step's
        is saved already; its step."""
        step = int(values['global_step'])
        if step != self.last:
            for name, copy in self.copies.items():
                copy.assign(values[name])
            self.manager.save(checkpoint_number=step)
            self.last = step
        return step


class Log:
    """The coordinator's lines of how long and fast it trained, and its
    summaries of loss and accuracy in logdir, for TensorBoard: a write
    there that fails (a full disk) is one line, and ends the summaries, not
    the run, as the TF1 scripts' do. `name` is the coordinator's, in its
    lines."""

    def __init__(self, task_index, start, logdir, name, epochs=None,
                 steps_per_epoch=None):
        self.index, self.start = task_index, start
        self.epochs, self.steps_per_epoch = epochs, steps_per_epoch
        self.started = time.monotonic()
        self.failed = Logdir(logdir, name).failed
        self.writer = logdir and self._write(
            lambda: tf.summary.create_file_writer(logdir))

    def epoch(self, step, **values):
        """After an epoch, at global step `step`: how far the run is, and
        how long it has left at its pace; the summaries of values."""
        last = self.epochs and self.epochs * self.steps_per_epoch
        pace = (step - self.start) / (time.monotonic() - self.started)
        if last and step < last and pace > 0:
            print('worker=%d, global_step=%d, %.0f steps/s, epoch %d of %d, '
                  '%s' % (self.index, step, pace, step // self.steps_per_epoch
                          + 1, self.epochs, time_left((last - step) / pace)),
                  flush=True)
        self._summaries(step, **values)

    def _summaries(self, step, **values):
        # The TF1 scripts' simple values, which TensorBoard reads without
        # its own package in this process.
        summary = tf.compat.v1.Summary(value=[
            tf.compat.v1.Summary.Value(tag=tag, simple_value=value)
            for tag, value in values.items()])

        def write():
            with self.writer.as_default():
                tf.summary.experimental.write_raw_pb(
                    summary.SerializeToString(), step=step)
            # A full disk fails here, once a write needs a new block.
            self.writer.flush()
        if self.writer:
            self._write(write)

    def final(self, step, accuracy):
        seconds = time.monotonic() - self.started
        print('worker=%d, local_steps=%d, global_step=%d, train_seconds=%.1f, '
              'steps_per_sec=%.1f' % (self.index, step - self.start, step,
                                      seconds, (step - self.start) / seconds),
              flush=True)
        self._summaries(step, test_accuracy=accuracy)
        if self.writer:
            self._write(self.writer.close)

    def _write(self, write):
        """write()'s value, or None once it failed: said in one line, and
        the summaries end."""
        try:
            return write()
        except (tf.errors.OpError, OSError) as e:
            self.failed('write summaries', e)
            self.writer = None
            return None
