"""TensorFlow 2's coordinator: what it adds to TensorFlow's own, to end in
one line, never hang, and start again after a lost ps."""

import os
import sys
import threading
import time
import traceback

import tensorflow as tf

from ps_cluster import errors, exits
from ps_cluster.deadlines import call_within, in_thread, poll
from ps_cluster.exits import TaskFailed
from ps_cluster.logdir import CHIEF_DONE, CHIEF_LEFT, Logdir
from ps_cluster.settings import GPU_JOBS
from ps_cluster.tf2 import coordinated, restart
from ps_cluster.tf2.checkpoints import Checkpoints
from ps_cluster.tf2.log import Log
from ps_cluster.tf2.servers import Servers
from ps_cluster.tf2.task import Tf2Task


class Coordinator(Tf2Task):
    """TensorFlow 2's chief (a Tf2Task), which coordinates and trains
    nothing: it sees only its own GPU, tells its servers why it ends, saves
    on a preemption, and ends in one line on an error, but starts again
    from its last checkpoint after a lost ps."""

    # How long the coordinator tries to tell its servers it is done.
    DONE_SECS = 30

    def __init__(self, task):
        super().__init__(task)
        self.servers = Servers(self.cluster, self.task_index)
        # An evaluator follows its word in logdir/tf2.
        self.saved = self.markers = None
        task.end.before_leaving(self._tell_servers)
        # Its eager runtime would take the whole of every GPU it sees at
        # its first op: it sees only its own, if gpu_jobs gives it one, and
        # takes that as it needs it.
        gpus = tf.config.list_physical_devices('GPU')
        index = task.gpu.index
        mine = [] if index is None else gpus[index:index + 1]
        tf.config.set_visible_devices(mine, 'GPU')
        for gpu in mine:
            tf.config.experimental.set_memory_growth(gpu, True)
        if self.settings.logdir:
            self.markers = Logdir(os.path.join(self.settings.logdir, 'tf2'),
                                  self.name)
        task.end.on_preemption(self._preempted,
                               self.settings.preemption_grace)
        self._end_on_errors()

    def load_mnist(self, images_per_step):
        """The data sets of data_dir, once logdir takes a file and the
        markers of a run before are gone."""
        self.task.check_logdir()
        if self.markers:
            self.markers.forget_ended()
        return self.task.load_mnist(images_per_step)

    def wait_for_servers(self):
        """Until every ps and worker answers, or TaskFailed naming those
        that do not after startup_timeout: TensorFlow 2's strategy
        connects to all of them at once, and its first steps fail on a ps
        not yet up."""
        self.servers.wait_for_all(self.settings.startup_timeout)

    def checkpoints(self, **variables):
        """TensorFlow 2's checkpoints of variables in logdir/tf2, from
        which a run with the same logdir goes on; where there is none, a
        TF1 script's in logdir, read by name, is restored instead (with
        any split of w). Returns a Checkpoints."""
        self.saved = Checkpoints(self.settings.logdir, variables, self.name)
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

    def _read_secs(self):
        """How long a preemption's save tries to read the variables, a
        quarter of preemption_grace: after a network cut, even one that
        healed, a connection may carry no call for minutes."""
        return self.settings.preemption_grace.secs / 4

    def _check_preempted(self):
        """A ps that says it was preempted: the coordinator saves, and tells
        it, which then leaves; the steps on it fail, and the coordinator
        starts again once it is back."""
        for name, address in self.servers.tasks('ps').items():
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
        not answer, once the global step has not moved for stall_timeout.
        The global step is read meanwhile, and, with logdir, the
        variables, for a save that cannot read them (Checkpoints.follow()).
        A step's error is raised here."""
        stall, every = self.settings.stall_timeout, Servers.WORKER_CHECK_SECS
        joining = in_thread(coordinator.join)
        # One read at a time, however long it takes (a bigger model, a slow
        # link): a frozen ps blocks one for good.
        reading, last, moved = None, None, time.monotonic()
        while True:
            done = poll(joining.done, every, 0.05)
            # Every WORKER_CHECK_SECS, however short each join.
            if time.monotonic() - self.servers.checked >= every:
                self.servers.check_workers()
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
            if time.monotonic() - moved > stall.secs:
                raise TaskFailed('no new global step for %s; %s' % (
                    stall, self.servers.silent() or 'every task answers'))
        joining.result()  # a step's error, raised again
        restart.epoch_done()

    def within(self, function, *args):
        """function(*args), a call into the cluster; or, once it has taken
        stall_timeout (a frozen ps blocks it for good), TaskFailed naming
        the tasks that do not answer."""
        stall = self.settings.stall_timeout
        try:
            return call_within(stall.secs, function, *args)
        except TimeoutError:
            raise TaskFailed('no answer for %s; %s' % (
                stall, self.servers.silent() or 'every task answers'))

    def _end_on_errors(self):
        """An error of TensorFlow's that the coordinator's main thread
        raises, in a step or as it reads or saves the variables, ends it in
        one line; but after an error of a lost ps, the ps tasks are waited
        for, ps_timeout, and the coordinator starts again: TensorFlow 2's
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
                    restart.start_again(  # it ends this process image
                        error, self.servers, self.settings.ps_timeout)
                if issubclass(kind, ValueError) and (
                        'Mismatched number of GPUs' in str(error)):
                    raise TaskFailed('the workers see different numbers of '
                                     'GPUs, which TensorFlow 2\'s strategy '
                                     'cannot use: one each, or none (%s)'
                                     % GPU_JOBS)
            except TaskFailed as e:
                if self.settings.tracebacks:
                    traceback.print_exception(kind, error, trace)
                self.end.fail(e.message, e.status)
            one_line(kind, error, trace)
        sys.excepthook = on_error

    def log(self, start, steps_per_epoch):
        """What the coordinator prints beyond the epoch lines, how far the
        run is among them, and writes in logdir for TensorBoard."""
        return Log(self.task_index, start, self.settings.logdir, self.name,
                   self.settings.epochs, steps_per_epoch)

    def export(self, module, step, accuracy):
        """With export_dir, writes `module` as a SavedModel in a folder
        named after the global step, and says its test accuracy."""
        if not self.settings.export_dir:
            return
        path = os.path.join(self.settings.export_dir, str(step))
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
                  'each waits for it %s, then fails'
                  % (self.name, ', '.join(untold), self.DONE_SECS,
                     self.settings.worker_timeout.flag), flush=True)
        if self.markers and self.saved.last is not None:
            self.markers.say(CHIEF_DONE, str(self.saved.last))
        self.end.leave()

    def _tell_servers(self, word, secs=exits.TaskEnd.LAST_WORDS_SECS):
        # An evaluator waits for a coordinator that was preempted.
        if self.markers and word != coordinated.DONE and not word.startswith(
                coordinated.PREEMPTED):
            self.markers.say(CHIEF_LEFT, word)
        return self.servers.tell(word, secs)
