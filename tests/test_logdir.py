"""The chief's --logdir (ps_cluster/logdir.py): in-process, the check
before the chief joins, why the chief left, a checkpoint that cannot be
saved, and the summary writer's thread and close; in a cluster of
processes, TensorBoard events, checkpoints, resuming, a restarted chief, a
full or unwritable logdir."""

import concurrent.futures
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest

from conftest import (SCRIPTS, SHORT_RUN, START_UP, assert_clean_exit,
                      assert_one_error_line, evaluations, final_accuracies,
                      listening, small_disks)
from launcher.compare import TIMING

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
import tensorflow.compat.v1 as tf  # noqa: E402

from ps_cluster.exits import TaskFailed  # noqa: E402
from ps_cluster.logdir import (  # noqa: E402
    CHIEF_DONE, CHIEF_LEFT, Logdir, marker)


def chief_left(path, since):
    return marker(path, CHIEF_LEFT, since)


def chief_done(path, since):
    done = marker(path, CHIEF_DONE, since)
    return int(done) if done else None

tf.disable_v2_behavior()

CHIEF = '/job:worker/task:0'


def test_check_makes_the_logdir_or_takes_the_one_there(tmp_path):
    path = tmp_path / 'new' / 'logdir'
    Logdir(str(path), CHIEF).check()
    # Made, and the probe file it wrote is gone.
    assert path.is_dir() and os.listdir(path) == []
    (path / 'checkpoint').write_text('kept')
    Logdir(str(path), CHIEF).check()
    assert os.listdir(path) == ['checkpoint']


# The logdir a file, or under one.
@pytest.mark.parametrize('name', ['file', 'file/logdir'])
def test_check_refuses_a_file(tmp_path, name):
    (tmp_path / 'file').write_text('')
    path = str(tmp_path / name)
    with pytest.raises(TaskFailed) as refused:
        Logdir(path, CHIEF).check()
    assert refused.value.status == 2
    assert re.fullmatch(r'--logdir=%s: cannot write there \(.+\)'
                        % re.escape(path), str(refused.value))


def test_chief_left_is_the_reason_only_if_newer_than_since(tmp_path):
    logdir = Logdir(str(tmp_path), CHIEF)
    assert chief_left(str(tmp_path), 0) is None  # no marker
    logdir.say(CHIEF_LEFT, 'interrupted')
    # A marker from before `since` is an earlier run's.
    os.utime(tmp_path / 'chief_left', (1000, 1000))
    assert chief_left(str(tmp_path), 999) == 'interrupted'
    assert chief_left(str(tmp_path), 1000) == 'interrupted'
    assert chief_left(str(tmp_path), 1001) is None


def test_forget_ended_removes_both_markers(tmp_path):
    logdir = Logdir(str(tmp_path), CHIEF)
    logdir.say(CHIEF_LEFT, 'interrupted')
    logdir.say(CHIEF_DONE, '90')
    assert chief_done(str(tmp_path), 0) == 90
    logdir.forget_ended()
    assert os.listdir(tmp_path) == []
    assert chief_left(str(tmp_path), 0) is None
    assert chief_done(str(tmp_path), 0) is None
    logdir.forget_ended()  # none to remove: nothing to say


def test_chief_done_is_its_last_step_only_if_newer_than_since(tmp_path):
    Logdir(str(tmp_path), CHIEF).say(CHIEF_DONE, '60')
    os.utime(tmp_path / 'chief_done', (1000, 1000))
    assert chief_done(str(tmp_path), 1000) == 60
    assert chief_done(str(tmp_path), 1001) is None


def test_say_left_makes_a_logdir_not_made_yet(tmp_path):
    path = tmp_path / 'not' / 'made'
    Logdir(str(path), CHIEF).say(CHIEF_LEFT, 'cannot place the model')
    assert chief_left(str(path), 0) == 'cannot place the model'


def test_say_left_where_nothing_can_be_written_is_silent(tmp_path):
    (tmp_path / 'file').write_text('')
    path = str(tmp_path / 'file' / 'logdir')
    Logdir(path, CHIEF).say(CHIEF_LEFT, 'interrupted')
    assert chief_left(path, 0) is None


def test_a_checkpoint_that_cannot_be_saved_is_one_line(tmp_path, capsys):
    logdir = str(tmp_path)
    # The chief's Supervisor, as the scripts make it, on a server of this
    # process.
    with tf.Graph().as_default():
        global_step = tf.train.get_or_create_global_step()
        tf.Variable(tf.ones([3]), name='w')
        sv = tf.train.Supervisor(
            is_chief=True, logdir=logdir,
            init_op=tf.global_variables_initializer(),
            global_step=global_step,
            saver=tf.train.Saver(save_relative_paths=True),
            save_model_secs=0)
    sess = sv.prepare_or_wait_for_session(
        tf.train.Server.create_local_server().target,
        start_standard_services=False)
    try:
        saving = Logdir(logdir, CHIEF)
        global_step.load(7, sess)
        # A directory where the checkpoint's index goes.
        os.makedirs(os.path.join(logdir, 'model.ckpt-7.index', 'in_the_way'))
        saving.save_checkpoint(sv, sess)
        assert re.fullmatch(
            r'%s: error: cannot save a checkpoint in --logdir=%s \(.+\); '
            r'training goes on\n' % (CHIEF, re.escape(logdir)),
            capsys.readouterr().err)
        assert tf.train.latest_checkpoint(logdir) is None
        # The next one is saved, at the global step.
        global_step.load(8, sess)
        saving.save_checkpoint(sv, sess)
        assert capsys.readouterr().err == ''
        saved = tf.train.latest_checkpoint(logdir)
        assert saved == os.path.join(logdir, 'model.ckpt-8')
        assert tf.train.load_variable(saved, 'global_step') == 8
        assert list(tf.train.load_variable(saved, 'w')) == [1, 1, 1]
    finally:
        sv.stop()


def test_a_save_never_runs_beside_the_one_before(tmp_path, monkeypatch,
                                                 capsys):
    # The one before, stuck on a lost ps, holds the lock: the next gives up
    # after LOCK_SECS, before it touches the Saver, and says so.
    monkeypatch.setattr(Logdir, 'LOCK_SECS', 0.2)
    saving = Logdir(str(tmp_path), CHIEF)
    saving._saving.acquire()
    with pytest.raises(ValueError, match='^the save before it has not ended '
                       'within 0.2 s$'):
        saving.save(None, None)
    assert saving.save_checkpoint(None, None) is None
    assert capsys.readouterr().err == (
        '%s: error: cannot save a checkpoint in --logdir=%s (the save before '
        'it has not ended within 0.2 s); training goes on\n'
        % (CHIEF, tmp_path))


def test_failed_is_one_line(tmp_path, capsys):
    error = tf.errors.ResourceExhaustedError(None, None, 'No space left')
    Logdir(str(tmp_path), CHIEF).failed('write summaries', error)
    assert capsys.readouterr().err == (
        '%s: error: cannot write summaries in --logdir=%s (No space left); '
        'training goes on\n' % (CHIEF, tmp_path))


def test_close_summaries_closes_the_writer(tmp_path, capsys):
    before = set(threading.enumerate())
    writer = tf.summary.FileWriter(str(tmp_path))
    [thread] = [t for t in set(threading.enumerate()) - before
                if t.name == 'EventLoggerThread']
    writer.add_summary(tf.Summary(value=[
        tf.Summary.Value(tag='loss', simple_value=0.5)]), 3)
    Logdir(str(tmp_path), CHIEF).close_summaries(writer)
    assert not thread.is_alive()
    assert capsys.readouterr().err == ''
    # Written out as it closed.
    [events] = glob.glob(str(tmp_path / 'events.out.*'))
    assert [(e.step, v.tag, v.simple_value)
            for e in tf.train.summary_iterator(events)
            for v in e.summary.value] == [(3, 'loss', 0.5)]


def test_the_summary_writers_thread_is_known_by_its_type(tmp_path):
    before = set(threading.enumerate())
    writer = tf.summary.FileWriter(str(tmp_path))
    [thread] = [t for t in set(threading.enumerate()) - before
                if t.name == 'EventLoggerThread']
    try:
        # As cluster_utils' excepthook knows it.
        assert type(thread).__name__ == '_EventLoggerThread'
    finally:
        writer.close()


STARTING = re.compile(r'^worker=(\d+), starting at global_step=(\d+)$', re.M)


def events(logdir):
    """{tag: [global steps]} of the scalars in logdir's event files."""
    tags = {}
    for path in glob.glob(os.path.join(logdir, 'events.out.*')):
        for event in tf.train.summary_iterator(path):
            for value in event.summary.value:
                tags.setdefault(value.tag, []).append(event.step)
    return tags


def run(procs, free_ports, runs, timeout=START_UP):
    """Clusters side by side, {name: (script, flags[, shape])}, shape as
    procs.cluster's num_ps and num_workers: {name: the workers' outputs},
    once every task has ended cleanly."""
    clusters = {}
    for name, (script, flags, *shape) in runs.items():
        ps, workers = procs.cluster(script, free_ports, *flags, name=name,
                                    **(shape[0] if shape else {}))
        clusters[name] = (ps if isinstance(ps, list) else [ps]), workers
    procs.wait_all([p for ps, workers in clusters.values()
                    for p in workers + ps], timeout)
    return {name: [assert_clean_exit(procs, p, 0) for p in workers + ps][
        :len(workers)] for name, (ps, workers) in clusters.items()}


@pytest.mark.slow
@pytest.mark.parametrize('script', ['async', 'sync'])
def test_summaries_checkpoints_and_resume(procs, free_ports, small_data,
                                          tmp_path, script):
    logdir = str(tmp_path / 'logdir')
    flags = ['--data_dir=' + small_data, '--validation_size=100',
             '--print_every_epochs=2', '--learning_rate=0.5',
             '--logdir=' + logdir]
    # Beside the cluster, an evaluator; the chief exports the model it
    # trained, the evaluator the one of the last checkpoint. 50 ms a step
    # and a checkpoint a second: 3 s, and several checkpoints. Sync's
    # model is split on 2 ps; the evaluator and the export have one w.
    num_ps = 2 if script == 'sync' else 1
    split = ['--split_w'] if script == 'sync' else []
    ports = free_ports(num_ps + 3)
    ps, workers = procs.cluster(
        script, lambda n: ports, '--epochs=6', *flags, '--step_delay_ms=50',
        '--save_checkpoint_secs=1', '--export_dir=%s' % (tmp_path / 'chief'),
        *split, num_ps=num_ps)
    ps = ps if isinstance(ps, list) else [ps]
    evaluator = procs.script(script, 'evaluator', 0, ports[:num_ps],
                             ports[num_ps:], '--epochs=6', *flags,
                             '--export_dir=%s' % (tmp_path / 'evaluator'))
    procs.wait_all(workers + ps, START_UP)
    outputs = [assert_clean_exit(procs, p, 0) for p in workers + ps][:3]
    if split:  # a shard of w on each ps, and no ps above 55% of the model
        shares = re.findall(r'^/job:worker/task:0: /job:ps/task:\d \S+ '
                            r'holds .*w/part_.*, ([\d.]+)% of the model$',
                            outputs[0], re.M)
        assert len(shares) == 2 and max(map(float, shares)) <= 55, outputs
    procs.wait_all([evaluator], START_UP)
    assert_evaluated_and_exported(procs, evaluator, outputs, logdir,
                                  tmp_path, script, small_data)
    local_steps = []
    for i, output in enumerate(outputs):
        timing = TIMING.findall(output)
        assert [int(w) for w, *_ in timing] == [i]
        local_steps.append(int(timing[0][1]))
    if script == 'async':
        assert local_steps == [60, 60, 60]
    else:  # 60 updates of 3 gradients each; a latecomer may find it done
        assert sum(local_steps) >= 180

    tags = events(logdir)
    # The chief writes validation accuracy with each of its epoch lines:
    # epochs 1, 3 and 5 in async runs; in sync runs it may do more or fewer
    # epochs than the others.
    epoch_lines = re.findall(r'^worker=0,epoch=', outputs[0], re.M)
    assert len(tags['validation_accuracy']) == len(epoch_lines) > 0
    if script == 'async':
        assert len(epoch_lines) == 3
    # Test accuracy too, and once more at the end.
    assert len(tags['test_accuracy']) == len(epoch_lines) + 1
    # Loss every 50 of the chief's own steps: a sync chief may take fewer
    # than 50, as the other workers take the tokens while it validates.
    assert len(tags.get('loss', [])) == local_steps[0] // 50
    assert all(s > 0 for s in tags.get('loss', []))
    assert tags['validation_accuracy'] == sorted(tags['validation_accuracy'])
    saved = tf.train.latest_checkpoint(logdir)
    assert saved
    # The step stored in the checkpoint: in async runs other workers may
    # move it on between the read that names the file and the save.
    saved_step = int(tf.train.load_variable(saved, 'global_step'))
    assert saved_step >= tags['test_accuracy'][-1] > 0

    # The same cluster again, to 9 epochs, on 1 ps, w whole: it goes on
    # from the checkpoint; in sync with a backup worker
    # (--replicas_to_aggregate=2). Beside it, on a copy of the logdir, a
    # cluster of another shape: the model and the global step carry over,
    # what is per worker or per ps is made anew (async: 2 ps and 2 workers,
    # w split anew, 2 steps a run, to 12 epochs, 240 steps; sync: 3 ps, w
    # in 3 shards, and 4 workers); then async's copy, back to w whole.
    shapes = ({'two_ps': (['--epochs=12', '--split_w', '--steps_per_run=2'],
                          {'num_ps': 2, 'num_workers': 2})}
              if script == 'async' else
              {'three_ps': (['--epochs=9', '--split_w'],
                            {'num_ps': 3, 'num_workers': 4})})
    again = ['--replicas_to_aggregate=2'] if script == 'sync' else []
    copies = {}
    for name in shapes:
        copies[name] = str(tmp_path / name)
        shutil.copytree(logdir, copies[name])
    outputs = run(procs, free_ports, dict(
        {script: (script, ['--epochs=9'] + again + flags)},
        **{name: (script, more + flags[:-1] + ['--logdir=' + copies[name]],
                  shape) for name, (more, shape) in shapes.items()}))
    for name, (_, shape) in shapes.items():
        chief = outputs[name][0]
        restored = re.search(
            r'^worker=0: restored the model from (.*) at global_step=(\d+), '
            r'on (\d+) ps and (\d+) workers$', chief, re.M)
        assert restored, chief
        # From the copy's own checkpoint, not the original's, which the
        # cluster beside it overwrites.
        assert restored.group(1).startswith(copies[name] + os.sep)
        assert int(restored.group(2)) == saved_step > 0
        assert (int(restored.group(3)), int(restored.group(4))) == (
            shape.get('num_ps', 1), shape.get('num_workers', 3))
        [(_, start)] = STARTING.findall(chief)
        assert int(start) >= saved_step
        final = max(int(TIMING.findall(o)[0][2]) for o in outputs[name])
        assert final >= (240 if script == 'async' else 90)
    outputs = outputs[script]
    assert ('worker=0: restored the model from %s at global_step=%d, on 1 ps '
            'and 3 workers\n' % (saved, saved_step)) in outputs[0]
    [(_, start)] = STARTING.findall(outputs[0])
    if script == 'sync':  # no update before the chief's queue runner
        assert int(start) == saved_step
    else:
        # The other workers may find the restored model, and take steps,
        # before the chief reads the step.
        assert int(start) >= saved_step
    final_step = max(int(TIMING.findall(o)[0][2]) for o in outputs)
    if script == 'sync':
        assert final_step == 90
    else:
        # Each worker stops at the start of an epoch (10 steps) once the
        # global step has reached 3 x 90; the step is read beside the
        # update, so it may lag by one.
        assert 269 <= final_step <= 270 + 3 * 10
    assert tf.train.latest_checkpoint(logdir) != saved
    if script == 'async':
        # And back: the copy, written split on 2 ps, resumes whole on 1 ps,
        # with 1 worker, to 30 epochs: 300 steps.
        split_saved = tf.train.latest_checkpoint(copies['two_ps'])
        split_step = int(tf.train.load_variable(split_saved, 'global_step'))
        [chief] = run(procs, free_ports, {'whole': (
            script, ['--epochs=30'] + flags[:-1]
            + ['--logdir=' + copies['two_ps']], {'num_workers': 1})})['whole']
        assert ('worker=0: restored the model from %s at global_step=%d, on '
                '1 ps and 1 workers\n' % (split_saved, split_step)) in chief
        assert re.search(r'^/job:worker/task:0: /job:ps/task:0 \S+ holds b, '
                         r'global_step, w: [\d,]+ bytes, 100.0% of the '
                         r'model$', chief, re.M), chief
        assert int(TIMING.findall(chief)[0][2]) >= 300 > split_step


EXPORTED = (r'^%s: exported the model at global_step=(\d+) to (\S+); its '
            r'test accuracy = (\S+)$')
# In a fresh process with no cluster: the SavedModel's accuracy on the test
# set, through its serving signature.
LOAD = """
import sys
import numpy as np
import tensorflow as tf
import mnist_data
test = mnist_data.read_data_sets(sys.argv[1], 100).test
images = mnist_data.as_float(test).images
for path in sys.argv[2:]:
    serve = tf.saved_model.load(path).signatures['serving_default']
    out = serve(images=tf.constant(images))
    assert np.allclose(np.sum(out['probabilities'], 1), 1, atol=1e-5)
    print(np.mean(out['classes'].numpy() == test.labels))
"""


def assert_evaluated_and_exported(procs, evaluator, outputs, logdir,
                                  tmp_path, script, data_dir):
    """The evaluator measured every checkpoint it saw, at least 3, the last
    at the run's last step, and wrote each as a summary; the chief's and
    the evaluator's SavedModels give the accuracy they said, in a fresh
    process, with no device of the cluster in them."""
    output = assert_clean_exit(procs, evaluator, 0)
    evaluated = evaluations(output)
    steps = [step for step, _ in evaluated]
    assert len(steps) >= 3 and steps == sorted(set(steps)), output
    last_step = 180 if script == 'async' else 60  # 6 epochs of 10 steps
    assert steps[-1] == last_step
    assert events(os.path.join(logdir, 'eval'))['accuracy'] == steps
    finals = [final_accuracies(o)[i] for i, o in enumerate(outputs)]
    if script == 'sync':  # every worker ends with the model of the last step
        assert all(abs(evaluated[-1][1] - a) < 1e-6 for a in finals)
    [(step, chief_path, chief_accuracy)] = re.findall(
        EXPORTED % '/job:worker/task:0', outputs[0], re.M)
    [(eval_step, eval_path, eval_accuracy)] = re.findall(
        EXPORTED % '/job:evaluator/task:0', output, re.M)
    assert int(step) == int(eval_step) == last_step
    assert chief_path == str(tmp_path / 'chief' / step)
    loaded = subprocess.run(
        [sys.executable, '-c', LOAD, data_dir, chief_path,
         eval_path], capture_output=True, text=True, timeout=START_UP)
    assert loaded.returncode == 0, loaded.stderr
    for said, got in zip((chief_accuracy, eval_accuracy),
                         loaded.stdout.split()):
        assert abs(float(said) - float(got)) < 1e-6
    if script == 'sync':
        assert all(abs(float(chief_accuracy) - a) < 1e-6 for a in finals)
        cli = os.path.join(os.path.dirname(sys.executable), 'saved_model_cli')
        shown = subprocess.run([cli, 'show', '--all', '--dir', chief_path],
                               capture_output=True, text=True, timeout=START_UP)
        assert "signature_def['serving_default']" in shown.stdout
        assert '/job:' not in shown.stdout + shown.stderr
        images = tmp_path / 'images.npy'
        np.save(images, np.full((2, 784), 0.5, np.float32))
        ran = subprocess.run(
            [cli, 'run', '--dir', chief_path, '--tag_set', 'serve',
             '--signature_def', 'serving_default',
             '--inputs', 'images=%s' % images],
            capture_output=True, text=True, timeout=START_UP)
        assert ran.returncode == 0 and 'classes' in ran.stdout, ran.stderr


STEPS = re.compile(r'^worker=1,epoch=\d+,global_step=(\d+),', re.M)


@pytest.mark.slow
def test_restarted_chief_completes_the_run(procs, free_ports, small_data,
                                           tmp_path):
    # Killed once worker 1 is at epoch 20 of 80, the two scripts side by
    # side: 10 ms a step leaves 6 s of steps at least after the kill.
    runs = {}
    for script in SCRIPTS:
        flags = ['--data_dir=' + small_data, '--validation_size=100',
                 '--print_every_epochs=1', '--epochs=80',
                 '--step_delay_ms=10',
                 '--logdir=' + str(tmp_path / script / 'logdir')]
        ports = free_ports(4)
        runs[script] = flags, ports, procs.cluster(
            script, lambda n: ports, *flags, name=script)

    def restart_chief(script):
        # Each cluster as it gets there: waiting for one first could leave
        # the other's run ended before its chief is killed.
        flags, ports, (ps, workers) = runs[script]
        assert procs.wait_for_output(workers[0], r'^worker=0: initialized '
                                     r'the model$', START_UP)
        procs.wait_for_output(workers[1], r'^worker=1,epoch=20,', START_UP)
        os.kill(workers[0].pid, signal.SIGKILL)
        workers[0].wait()
        return procs.script(script, 'worker', 0, ports[:1], ports[1:],
                            *flags, name=script + '-again')
    with concurrent.futures.ThreadPoolExecutor(len(runs)) as pool:
        chiefs = dict(zip(runs, pool.map(restart_chief, runs)))
    # The async chief joins the model the others train on the ps, and
    # neither initializes it again nor restores an older one.
    joined = procs.wait_for_output(
        chiefs['async'], r'^worker=0: joined the live model on the ps at '
                         r'global_step=(\d+)$', START_UP)
    assert int(joined.group(1)) > 200
    procs.wait_all([p for s, (_, _, (ps, workers)) in runs.items()
                    for p in [chiefs[s]] + workers[1:] + [ps]], 180)
    for script, (_, _, (ps, workers)) in runs.items():
        for i, worker in enumerate([chiefs[script]] + workers[1:]):
            assert i in final_accuracies(assert_clean_exit(procs, worker, 0))
        assert_clean_exit(procs, ps, 0)
        assert STARTING.search(procs.output(chiefs[script]))
    assert 'initialized the model' not in procs.output(chiefs['async'])
    # Worker 1's global step never went back.
    _, _, (_, workers) = runs['async']
    steps = [int(s) for s in STEPS.findall(procs.output(workers[1]))]
    # Each of its 80 epochs, unless the others took the run to its last
    # step, 80 epochs of 10 steps by 3 workers, before its last began.
    assert steps == sorted(steps) and (len(steps) == 80
                                       or steps[-1] >= 80 * 10 * 3), steps


@pytest.mark.slow
def test_full_logdir_costs_checkpoints_not_training(procs, free_ports,
                                                    small_data, tmp_path):
    # A file system that fills up after the first checkpoint or so, for each
    # script, side by side.
    logdirs = {script: tmp_path / script for script in SCRIPTS}
    with small_disks(logdirs.values(), '300k'):
        outputs = run(procs, free_ports, {
            script: (script, ['--data_dir=' + small_data,
                              '--logdir=' + str(logdir),
                              '--save_checkpoint_secs=0.5', '--epochs=60',
                              '--validation_size=100', '--step_delay_ms=10'])
            for script, logdir in logdirs.items()}, timeout=180)
    for script, logdir in logdirs.items():
        for i, output in enumerate(outputs[script]):
            assert i in final_accuracies(output)
        # One line each time a save fails.
        failed = re.findall(r'^/job:worker/task:0: error: cannot save a '
                            r'checkpoint in --logdir=%s \(.+\); training goes '
                            r'on$' % re.escape(str(logdir)),
                            outputs[script][0], re.M)
        assert failed, outputs[script][0]


@pytest.mark.slow
def test_unwritable_logdir(procs, free_ports, small_data, tmp_path):
    not_a_dir = tmp_path / 'file'
    not_a_dir.write_text('')
    ports = free_ports(2)
    chief = procs.script('async', 'worker', 0, ports[:1], ports[1:],
                         '--data_dir=' + small_data,
                         '--logdir=%s' % (not_a_dir / 'logdir'), *SHORT_RUN)
    procs.wait_all([chief], START_UP)
    assert_one_error_line(procs, chief, 2,
                          '--logdir=%s' % (not_a_dir / 'logdir'),
                          'cannot write there')
    # It never joined the cluster.
    assert not listening(ports[1])
