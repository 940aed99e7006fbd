"""The session that outlives a lost ps
(ps_cluster/worker/recoverable_session.py): in-process, with servers of one
cluster in the test's process, the chief opens it once the ps is up, trains in
it, and closing it ends the Supervisor's threads and marks the worker done on
the ps; with no ps at its address, it fails after the startup timeout. In a
cluster of processes, a ps killed and started again on its port, or stopped and
continued and then with its connections broken, and every worker stopped and
continued, each cost no worker its run. A ps that does not come back ends every
worker: test_stall_watch.py, beside the stalled runs."""

import concurrent.futures
import glob
import os
import re
import shutil
import signal
import subprocess
import threading
import time
import warnings

import pytest

from conftest import (FINAL_STEP, START_UP, assert_clean_exit,
                      final_accuracies, ps_port)

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
import tensorflow.compat.v1 as tf  # noqa: E402

from ps_cluster import errors, liveness, probes, server  # noqa: E402
from ps_cluster.deadlines import Limit, Outage  # noqa: E402
from ps_cluster.logdir import Logdir  # noqa: E402
from ps_cluster.exits import TaskFailed  # noqa: E402
from ps_cluster.worker.watchdog import Watchdog  # noqa: E402
from ps_cluster.ps.ps_task import PsTask  # noqa: E402
from ps_cluster.worker.recoverable_session import (  # noqa: E402
    RecoverableSession)
from ps_cluster.worker.session_start import SessionCreator  # noqa: E402
from ps_cluster.sources import Place  # noqa: E402
from ps_cluster.worker.stall_watch import StallWatch  # noqa: E402

import small_model  # noqa: E402
from ps_counters import done  # noqa: E402
from small_model import cluster_of  # noqa: E402

tf.disable_v2_behavior()

# A lost ps, and the new session opened when it is back, are left to the
# cluster tests below: a TensorFlow server cannot be stopped, and the ps
# must go away and come back on its port.


@pytest.fixture
def ps(shared_cluster):
    """The ps of a cluster of two workers, a server of this process, with
    the liveness counters its PsTask sets up."""
    cluster = shared_cluster()
    return PsTask(small_model.server(cluster, 'ps', 0),
                  Place(cluster, 'ps', 0))


class Died:
    """The stall watch's last resort, which keeps the failures it ends the
    worker with."""

    def __init__(self, died):
        self.fail = died.append


def recoverable_session(cluster, died, startup_timeout=10, hooks=(),
                        index=0, stall_timeout=60, logdir=None, build=None):
    """What worker `index` (the chief) of the scripts builds, in a graph of
    its own (the model, of 4 pixels and 2 classes, under
    replica_device_setter, and the Supervisor, of `logdir` if any), and its
    RecoverableSession, opened by its own server, with `hooks` and those
    that build() returns, which makes ops of the test's own in the graph,
    in a placed() of their own (a variable of theirs goes to ps 0 first);
    a failure the stall watch ends the worker with goes to died. Returns
    the session, the Supervisor and the training step."""
    worker = small_model.server(cluster, 'worker', index)
    with tf.Graph().as_default():
        global_step, train_op = small_model.training_step(cluster, index)
        with small_model.placed(cluster, index):
            hooks = list(hooks) + (build() if build else [])
        sv = tf.train.Supervisor(
            is_chief=index == 0, logdir=logdir,
            init_op=tf.global_variables_initializer(),
            global_step=global_step,
            saver=tf.train.Saver(save_relative_paths=True),
            recovery_wait_secs=1, save_model_secs=0)
        place = Place(cluster, 'worker', index)
        outage = Outage(Limit(10, '--ps_timeout'))
        watch = StallWatch(Died(died), place,
                           Limit(stall_timeout, '--stall_timeout'), outage)
        watch.start()
        creator = SessionCreator(sv, worker,
                                 server.session_config('worker', index),
                                 place, hooks, watch,
                                 Limit(startup_timeout, '--startup_timeout'),
                                 Limit(20, '--preemption_grace'),
                                 logdir and Logdir(logdir, place.name))
        sess = RecoverableSession(creator, outage).open()
    return sess, sv, train_op


def test_the_chief_opens_the_session_once_the_ps_is_up_and_trains(ps,
                                                                  capsys):
    died = []
    sess, sv, train_op = recoverable_session(ps.place.cluster, died)
    assert capsys.readouterr().out == 'worker=0: initialized the model\n'
    for _ in range(3):
        sess.run(train_op)
    assert sess.run(sv.global_step) == 3
    sess.close()
    assert died == []


class Hook(tf.train.SessionRunHook):
    def __init__(self):
        self.created, self.runs = [], 0

    def after_create_session(self, session, coord):
        self.created.append((session, coord))

    def after_run(self, run_context, run_values):
        self.runs += 1


def test_the_hooks_have_run_as_the_session_is_created(ps):
    hook = Hook()
    sess, sv, _ = recoverable_session(ps.place.cluster, [], hooks=[hook])
    assert hook.created == [(sess.session.session, sess.session.coord)]
    # And after each run, once it has returned.
    assert sess.run(sv.global_step) == 0
    sess.run(sv.global_step)
    assert hook.runs == 2 and len(hook.created) == 1
    sess.close()


def test_close_ends_the_supervisors_threads_and_marks_the_worker_done(ps):
    died = []
    sess, sv, _ = recoverable_session(ps.place.cluster, died)
    # The chief beats from the start; worker 1 never came.
    [chief_beats, worker_beats] = ps.sess.run(ps.beats)
    assert chief_beats > 0 and worker_beats == 0
    sess.close()
    assert sess.session.coord.should_stop()
    assert not sess.session.watchdog.is_alive()
    assert list(ps.sess.run(ps.beats)) == [liveness.DONE, 0]
    with pytest.raises(RuntimeError, match='closed Session'):
        sess.run(sv.global_step)
    assert died == []


def test_a_failure_a_thread_stores_is_raised_by_the_next_run(ps):
    died = []
    sess, sv, train_op = recoverable_session(ps.place.cluster, died)
    sess.run(train_op)
    errors.fail(sess.session.coord, 'the chief went away')
    with pytest.raises(TaskFailed, match='^the chief went away$'):
        sess.run(train_op)
    # And by close(), which marks nothing done.
    with pytest.raises(TaskFailed, match='^the chief went away$'):
        sess.close()
    assert died == []


def test_a_chief_gone_while_a_worker_opens_is_raised_by_its_main_thread(ps):
    # Worker 1 waits for the model, which the chief never makes: it left,
    # and says why on the ps. The worker's Watchdog stores it; the main
    # thread leaves its wait and raises it; the stall watch ends nothing.
    threading.Timer(2, liveness.say_left, (ps.place.cluster, 0,
                                           'bad data')).start()
    died = []
    with pytest.raises(TaskFailed) as failed:
        recoverable_session(ps.place.cluster, died, startup_timeout=60,
                            index=1)
    assert failed.value.message == (
        'the chief, /job:worker/task:0 (%s), went away before the model was '
        'ready: "bad data"' % ps.place.cluster.task_address('worker', 0))
    # Raised by the main thread's wait, which left it: not by the watch.
    assert failed.traceback[-1].name == '_wait_for_the_model'
    assert died == []


def test_a_thread_of_the_session_before_fails_nothing_of_the_next(ps):
    # A recovery makes a new session once the ps answers; a thread of the
    # one before that was still running (a save stuck on the lost ps), and
    # fails now, stores its failure in that session's coordinator alone.
    hook = Hook()
    died = []
    sess, sv, train_op = recoverable_session(ps.place.cluster, died,
                                             hooks=[hook])
    before = sess.session
    sess.session = sess.creator.create_session()
    errors.fail(before.coord, 'a save stuck on the lost ps failed')
    sess.run(train_op)
    assert [coord for _, coord in hook.created] == [
        before.coord, sess.session.coord]
    # The session before is closed, its Watchdog's too, and its threads
    # stopped.
    for session in (before.session, before.watchdog.session):
        with pytest.raises(RuntimeError, match='closed Session'):
            session.run(sv.global_step)
    assert not before.watchdog.is_alive()
    sess.close()
    assert died == []


def test_a_failure_stored_as_the_chief_saves_its_last_checkpoint_is_raised(
        ps, tmp_path, monkeypatch):
    monkeypatch.setattr(liveness, 'GONE_SECS', 0.1)  # worker 1 never came
    sess, sv, _ = recoverable_session(ps.place.cluster, [],
                                      logdir=str(tmp_path))
    # Once the chief has waited for the others, and as it saves its last
    # checkpoint: a failure is stored, and the session closed, as the stall
    # watch closes it. The save meets a closed session, and the failure is
    # what is raised.
    save = sess.creator.logdir.save

    def failing_meanwhile(sv, session, calling):
        errors.fail(sess.session.coord, 'the chief went away')
        session.close()
        return save(sv, session, calling)
    monkeypatch.setattr(sess.creator.logdir, 'save', failing_meanwhile)
    with pytest.raises(TaskFailed, match='^the chief went away$'):
        sess.close()


def test_a_ps_lost_as_a_worker_closes_is_recovered_from(ps, capsys):
    # Worker 0's training is over; as it closes, its Watchdog found the ps
    # lost. Closing waits for it, in a new session, and marks the worker
    # done there.
    sess, _, _ = recoverable_session(ps.place.cluster, [])
    lost = tf.errors.UnavailableError(None, None, 'Socket closed')
    sess.session.coord.request_stop((type(lost), lost, None))
    sess.close()
    assert list(ps.sess.run(ps.beats)) == [liveness.DONE, 0]
    assert capsys.readouterr().out == (
        'worker=0: initialized the model\n'
        'worker=0: lost the connection to a ps task (%s); waiting up to 10 s '
        'for it\n'
        'worker=0: joined the live model on the ps at global_step=0\n'
        'worker=0: resuming at global_step=0\n'
        % ps.place.cluster.task_address('ps', 0))


def test_a_recovery_beats_on_the_ps_that_stayed(shared_cluster, monkeypatch):
    # Of 2 ps tasks, ps 1 is lost, and the recovery waits for it: ps 0
    # hears worker 0 beat meanwhile, or would count it gone.
    cluster = shared_cluster(2, 2)
    ps0, _ = [PsTask(small_model.server(cluster, 'ps', k),
                     Place(cluster, 'ps', k)) for k in range(2)]
    sess, _, _ = recoverable_session(cluster, [])
    lost = tf.errors.UnavailableError(None, None, 'Socket closed')
    sess.session.coord.request_stop((type(lost), lost, None))
    sess.session.watchdog.join()  # its beats stop with the session
    sess.outage._since = time.monotonic() - 7  # 3 s left
    monkeypatch.setattr(probes, 'silent', lambda cluster, job: [1])
    before = ps0.sess.run(ps0.beats)[0]
    with pytest.raises(TaskFailed, match='which did not come back'):
        sess._recover(lost)
    assert ps0.sess.run(ps0.beats)[0] - before >= 3


def test_a_stuck_run_that_no_new_session_carries_on_says_so(ps, monkeypatch):
    sess, _, _ = recoverable_session(ps.place.cluster, [])
    sess.outage._since = time.monotonic() - 10  # no wait left
    monkeypatch.setattr(probes, 'silent', lambda cluster, job: [0])
    stuck = errors.Stuck(None, None, 'no new global step for 60 s '
                         '(--stall_timeout), waiting in a training run, '
                         'while every task answers')
    with pytest.raises(TaskFailed) as failed:
        sess._recover(stuck)
    assert failed.value.message == (
        stuck.message + '; no new session carried the run on within 10 s '
        '(--ps_timeout)')


def test_a_lost_session_is_abandoned_once_however_many_attempts(ps):
    sess, _, _ = recoverable_session(ps.place.cluster, [])
    before = sess.session
    before.abandon()
    closed = []
    before.watchdog.join = lambda: closed.append('a second time')
    before.abandon()
    assert closed == [] and not before.watchdog.is_alive()


def test_a_chief_saving_for_a_preempted_ps_that_left_gives_up_in_time(
        ps, free_ports, tmp_path):
    # The ps said it was preempted, and left before the chief's save: the
    # save's new session waits for it with no timeout, but the chief gives
    # up on it within --preemption_grace.
    sess, _, _ = recoverable_session(ps.place.cluster, [],
                                     logdir=str(tmp_path))
    creator = sess.creator
    creator.preemption_grace = Limit(8, '--preemption_grace')
    # Where the ps was: nothing.
    cluster = cluster_of(free_ports)
    creator.server = small_model.server(cluster, 'worker', 0)
    words = []
    saving = threading.Thread(target=lambda: words.append(
        creator.preempted(hold=True)), daemon=True)
    started = time.monotonic()
    saving.start()
    saving.join(20)
    assert not saving.is_alive() and time.monotonic() - started < 9
    assert words == ['cannot save the model in --logdir=%s (no answer within '
                     '8 s (--preemption_grace)): its updates since the last '
                     'checkpoint are lost' % tmp_path]
    sess.close()
    # A ps there at last lets the abandoned creation end, and its thread
    # with it: in a task, the task's end does.
    small_model.server(cluster, 'ps', 0)


def test_a_ps_preempted_during_a_recovery_gets_the_chiefs_save(
        ps, tmp_path, capsys):
    # The chief recovers from a lost ps (a network cut, say) that answers
    # again, then says it was preempted: the chief saves for it once, and
    # tells it, as it does for a preemption that began the recovery.
    sess, _, _ = recoverable_session(ps.place.cluster, [],
                                     logdir=str(tmp_path))
    ps.sess.run(ps.say, {ps.reason: liveness.PREEMPTED})
    sess.outage._since = time.monotonic() - 7  # 3 s left
    with pytest.raises(TaskFailed, match='which did not come back'):
        sess._recover(tf.errors.UnavailableError(None, None, 'Socket closed'))
    assert ps.sess.run(ps.farewell).decode() == (
        'preempted; the chief saved the model at global_step=0')
    assert capsys.readouterr().out.count(
        'worker=0: saved the model at global_step=0\n') == 1


def test_close_ends_at_once_with_a_thread_that_never_stops(ps):

    class Stubborn(tf.train.SessionRunHook):
        """A thread of the session's that never stops."""

        def after_create_session(self, session, coord):
            thread = threading.Thread(target=threading.Event().wait,
                                      daemon=True)
            coord.register_thread(thread)
            thread.start()
    sess, sv, _ = recoverable_session(ps.place.cluster, [],
                                      hooks=[Stubborn()])
    started = time.monotonic()
    sess.close()
    assert time.monotonic() - started < 5
    assert list(ps.sess.run(ps.beats)) == [liveness.DONE, 0]


def test_a_ps_that_freezes_as_a_recovery_reads_its_word_ends_the_worker(
        ps, monkeypatch):
    monkeypatch.setattr(StallWatch, 'POLL_SECS', 0.05)
    monkeypatch.setattr(StallWatch, 'GRACE_SECS', 0.1)
    died = []
    sess, _, _ = recoverable_session(ps.place.cluster, died,
                                     startup_timeout=1)
    # The ps answers the recovery's probe, then freezes: reading whether it
    # says it was preempted blocks for good, and it no longer answers.
    frozen, probed = threading.Event(), []
    monkeypatch.setattr(probes, 'silent', lambda cluster, job: (
        [0] if probed else probed.append(job) or []))
    monkeypatch.setattr(liveness, 'farewells', lambda cluster: frozen.wait()
                        and [liveness.PREEMPTED + '; the chief saved'])

    def recover():
        # Thawed at the end, the ps says it was preempted, and has the
        # chief's word: not back.
        with pytest.raises(tf.errors.UnavailableError):
            sess.creator.create_session()
    threading.Thread(target=recover, daemon=True).start()
    try:
        deadline = time.monotonic() + 30
        while not died and time.monotonic() < deadline:
            time.sleep(0.05)
        assert died[0] == (
            'lost the connection to /job:ps/task:0 (%s), waiting in reading '
            'the ps tasks\' farewells: not done within 1 s '
            '(--startup_timeout)' % ps.place.cluster.task_address('ps', 0))
    finally:
        frozen.set()


class Unstick(tf.train.SessionRunHook):
    """Puts an element in a queue in the second session only."""

    def __init__(self, enqueue):
        self.enqueue, self.created = enqueue, 0

    def after_create_session(self, session, coord):
        self.created += 1
        if self.created == 2:
            session.run(self.enqueue)


def test_a_run_stuck_while_every_task_answers_goes_on_in_a_new_session(
        ps, capsys, monkeypatch):
    # A run that waits for good while every task answers (a RunGraph that
    # gRPC sent twice after a cut network, in a run seen so): once the step
    # has stood still for --stall_timeout, a new session, in which it runs
    # again, and here goes on.
    monkeypatch.setattr(StallWatch, 'POLL_SECS', 0.2)
    done(ps.place.cluster, 1)  # the other worker ended: none is missing
    ops = {}

    def build():
        queue = tf.FIFOQueue(1, tf.int32)
        ops['dequeue'] = queue.dequeue()
        return [Unstick(queue.enqueue(1))]
    died = []
    sess, sv, _ = recoverable_session(ps.place.cluster, died,
                                      stall_timeout=1, build=build)
    assert sess.run(ops['dequeue']) == 1
    sess.close()
    assert died == []
    assert capsys.readouterr().out == (
        'worker=0: initialized the model\n'
        'worker=0: no new global step for 1 s (--stall_timeout), waiting in '
        'a training run, while every task answers; trying a new session\n'
        'worker=0: joined the live model on the ps at global_step=0\n'
        'worker=0: resuming at global_step=0\n')


def test_a_recovery_waits_for_a_loss_once_from_when_it_was_found(
        ps, monkeypatch):
    # The stall watch found the ps lost --ps_timeout (10 s) ago, and a run
    # meets it now: the recovery has no wait left, and makes one attempt,
    # which finds the ps still silent.
    sess, _, _ = recoverable_session(ps.place.cluster, [])
    sess.outage._since = time.monotonic() - 10
    attempts, create = [], sess.creator.create_session
    monkeypatch.setattr(sess.creator, 'create_session', lambda deadline: (
        attempts.append(deadline) or create(deadline)))
    monkeypatch.setattr(probes, 'silent', lambda cluster, job: [0])
    with pytest.raises(TaskFailed, match=r'which did not come back within '
                       r'10 s \(--ps_timeout\)$'):
        sess._recover(tf.errors.UnavailableError(None, None, 'Socket closed'))
    assert [deadline.limit.flag for deadline in attempts] == ['--ps_timeout']
    monkeypatch.undo()
    sess.close()


def test_an_attempt_that_fails_stops_its_watchdog(ps):
    # Worker 1's first attempt: its Watchdog beats, then the chief never
    # makes the model; the attempt fails, its Watchdog stopped and closed.
    def watchdogs():
        return [thread for thread in threading.enumerate()
                if isinstance(thread, Watchdog)]
    before = watchdogs()
    with pytest.raises(TaskFailed, match='did not initialize the model'):
        recoverable_session(ps.place.cluster, [], startup_timeout=1, index=1)
    assert [dog for dog in watchdogs() if dog not in before] == []


def test_no_ps_at_its_address_fails_the_worker_after_the_startup_timeout(
        free_ports):
    cluster = cluster_of(free_ports)  # nothing listens at the ps's port
    died = []
    started = time.time()
    with pytest.raises(TaskFailed) as failed:
        recoverable_session(cluster, died, startup_timeout=1)
    assert time.time() - started >= 1
    assert failed.value.message == (
        '/job:ps/task:0 (%s) did not come up within 1 s (--startup_timeout)'
        % cluster.task_address('ps', 0))
    assert died == []


# Long enough to be struck mid-run: 10 steps an epoch on the small data, 50
# ms a step, so that 35 epochs, 17 s at least, lie between the epoch at
# which a test strikes a cluster and its end.
LONG_RUN = ['--epochs=40', '--print_every_epochs=1', '--validation_size=100',
            '--step_delay_ms=50']


RESTORED = (r'^worker=0: restored the model from .*model\.ckpt-(\d+) at '
            r'global_step=\d+, on \d+ ps and \d+ workers$')


# Side by side, a restarted ps and a paused one. Restarted: async, its ps
# twice (a worker once hung after the second); sync, once; sync with 2 ps,
# once: the one killed holds a variable, the other the token queue, on which
# the chief's training step may wait while its update loop stops on the
# lost one. Paused, which ends, and connections that break, cost no run: the
# ps stopped (SIGSTOP) for 20 s, async and sync, and once their workers
# train again, the kernel closes the workers' connections to it, as a busy
# network may (`ss -K`, root only, destroys the sockets: async steps are
# short, and gRPC may connect again before one fails; sync workers wait on
# the ps for tokens, and each recovers); and every worker of an async run
# stopped, as behind a cut network, for longer than a notice of a worker
# gone and than the 15 s after which a ps once left: its ps waits
# (--worker_timeout).
@pytest.mark.slow
def test_a_restarted_or_paused_ps_costs_no_worker_its_run(
        procs, free_ports, small_data, tmp_path):
    paused = {script: procs.cluster(script, free_ports,
                                    '--data_dir=' + small_data, *LONG_RUN,
                                    name=script + '-ps-paused-')
              for script in ('async', 'sync')}
    silent = procs.cluster('async', free_ports, '--data_dir=' + small_data,
                           *LONG_RUN[1:], '--epochs=30',
                           '--worker_timeout=60', name='workers-paused-')
    runs = []
    for script, num_ps, restarts in (('async', 1, 2), ('sync', 1, 1),
                                     ('sync', 2, 1)):
        name = '%s-%dps-' % (script, num_ps)
        logdir = tmp_path / (name + 'logdir')
        # 40 epochs a restart: each struck 35 epochs or more before the end.
        flags = ['--data_dir=' + small_data, '--logdir=%s' % logdir,
                 '--save_checkpoint_secs=1'] + LONG_RUN + [
                     '--epochs=%d' % (40 * restarts)]
        ports = free_ports(num_ps + 3)
        ps, workers = procs.cluster(script, lambda n: ports, *flags,
                                    num_ps=num_ps, name=name)
        runs.append(dict(script=script, num_ps=num_ps, restarts=restarts,
                         name=name, logdir=logdir, flags=flags, ports=ports,
                         ps=ps if num_ps > 1 else [ps], workers=workers,
                         lost=num_ps - 1))
    # Each cluster struck at its own epochs, from a thread of its own: one
    # waited for first could leave another's run ended before its fault.
    with concurrent.futures.ThreadPoolExecutor(len(runs) + 3) as pool:
        stories = [pool.submit(pause_ps, procs, *paused[script])
                   for script in paused]
        stories.append(pool.submit(pause_workers, procs, *silent))
        stories += [pool.submit(restart_ps, procs, run) for run in runs]
        for story in stories:
            story.result()
    everything = list(paused.values()) + [silent]
    procs.wait_all([p for ps, workers in everything for p in workers + [ps]]
                   + [p for run in runs for p in run['workers'] + run['ps']],
                   300)
    for run in runs:
        for i, worker in enumerate(run['workers']):
            output = assert_clean_exit(procs, worker, 0)
            assert i in final_accuracies(output)
            [(_, final_step)] = FINAL_STEP.findall(output)
            assert int(final_step) > run['restored']
        for proc in run['ps']:
            assert_clean_exit(procs, proc, 0)
    for ps, workers in everything:
        for i, worker in enumerate(workers):
            assert i in final_accuracies(assert_clean_exit(procs, worker, 0))
        assert_clean_exit(procs, ps, 0)
    for ps, workers in paused.values():
        for i, worker in enumerate(workers):
            output = procs.output(worker)
            # Whoever lost the connection found the live model, not a new
            # one.
            assert 'again' not in output and 'restored' not in output
            if 'lost the connection' in output:
                assert 'resuming at' in output
                if i == 0:
                    assert 'joined the live model' in output


def restart_ps(procs, run):
    """The run's ps `lost` killed mid-run and started again on its port,
    run['restarts'] times: every worker waits for it, the chief restores
    the last checkpoint, and every worker resumes from there on."""
    lost, ports, num_ps = run['lost'], run['ports'], run['num_ps']
    for restart in range(1, run['restarts'] + 1):
        procs.wait_for_epoch(run['workers'], 10 * restart - 5)
        assert glob.glob(str(run['logdir'] / 'model.ckpt-*.index'))
        os.kill(run['ps'][lost].pid, signal.SIGKILL)
        killed = time.time()
        run['ps'][lost].wait()
        for i, worker in enumerate(run['workers']):
            procs.wait_for_output(
                worker, r'^worker=%d: lost the connection to '
                        r'/job:ps/task:%d \(localhost:%d\); waiting up to '
                        r'120 s for it$' % (i, lost, ports[lost]), START_UP,
                count=restart, since=killed)
        run['ps'][lost] = procs.script(
            run['script'], 'ps', lost, ports[:num_ps], ports[num_ps:],
            *run['flags'], name=run['name'])
        started = time.time()
        run['restored'] = int(procs.wait_for_output(
            run['workers'][0], RESTORED, START_UP, count=restart,
            since=started).group(1))
        assert run['restored'] > 0
        for i, worker in enumerate(run['workers']):
            resumed = procs.wait_for_output(
                worker, r'^worker=%d: resuming at global_step=(\d+)$' % i,
                START_UP, count=restart, since=started)
            assert int(resumed.group(1)) >= run['restored']


# How long a paused task stays stopped.
PAUSE_SECS = 20


def pause_ps(procs, ps, workers):
    """The ps stopped mid-run for PAUSE_SECS and continued; then, once
    every worker trains again, the workers' connections to it broken."""
    procs.wait_for_epoch(workers, 5)
    os.kill(ps.pid, signal.SIGSTOP)
    time.sleep(PAUSE_SECS)
    assert all(p.poll() is None for p in workers + [ps])
    os.kill(ps.pid, signal.SIGCONT)
    if os.geteuid() != 0 or not shutil.which('ss'):
        warnings.warn(pytest.PytestWarning(
            'no connection broken: ss -K needs root and iproute2'))
        return
    for i, worker in enumerate(workers):
        epoch = r'^worker=%d,epoch=' % i
        procs.wait_for_output(worker, epoch, START_UP, count=len(re.findall(
            epoch, procs.output(worker), re.M)) + 1)
    port = ps_port(ps)
    killed = subprocess.run(['ss', '-K', 'dport', '=', ':%d' % port],
                            check=True, capture_output=True, text=True,
                            timeout=10).stdout
    assert ':%d ' % port in killed  # one socket at least


def pause_workers(procs, ps, workers):
    """Every worker stopped mid-run for PAUSE_SECS and continued."""
    procs.wait_for_epoch(workers, 2)
    for worker in workers:
        os.kill(worker.pid, signal.SIGSTOP)
    time.sleep(PAUSE_SECS)
    assert all(p.poll() is None for p in workers + [ps])
    for worker in workers:
        os.kill(worker.pid, signal.SIGCONT)
