"""mnist_dist_tf2.py run as a cluster, one process per task: going on from
a TF1 script's --logdir to a SavedModel that a fresh process loads; and the
faults its coordinator meets, a worker killed, a ps killed and started
again, Ctrl-C, in one run."""

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from conftest import (REPO, START_UP, assert_clean_exit, final_accuracies,
                      small_disks)

pytestmark = pytest.mark.slow  # not in the fast tier

SMALL = ('--validation_size=100', '--learning_rate=0.5')
EXPORTED = re.compile(r'exported the model at global_step=(\d+) to (\S+); its '
                      r'test accuracy = ([0-9.]+)$', re.M)
STARTING = re.compile(r'^worker=0, starting at global_step=(\d+) from (.*); '
                      r'test accuracy = ([0-9.]+)$', re.M)

# Classifies the test set of a data dir with a SavedModel, in a process of
# its own, as a user serving it would.
LOAD = '''
import sys
import numpy as np
import tensorflow as tf
import mnist_data
test = mnist_data.read_data_sets(sys.argv[2], 100).test
serve = tf.saved_model.load(sys.argv[1]).signatures['serving_default']
classes = serve(images=tf.constant(mnist_data.as_float(test).images))
print(np.mean(classes['classes'].numpy() == test.labels))
'''


def run(procs, cluster):
    """Waits for every task of cluster, (ps, workers), and checks each
    ended with status 0, without a traceback, leaving nothing running;
    returns the coordinator's output."""
    ps, workers = cluster
    tasks = (ps if isinstance(ps, list) else [ps]) + workers
    procs.wait_all(tasks, START_UP)
    for proc in tasks:
        output = assert_clean_exit(procs, proc, 0)
        assert not re.search(r'^E\d{4} ', output, re.M)
    return procs.output(workers[0])


def served_accuracy(path, data_dir):
    ran = subprocess.run([sys.executable, '-c', LOAD, path, data_dir],
                         cwd=REPO, capture_output=True, text=True,
                         timeout=START_UP)
    assert ran.returncode == 0, ran.stderr
    return float(ran.stdout.split()[-1])


@pytest.mark.xdist_group('real')  # real processes (pytest.ini)
@pytest.mark.parametrize('script,flags', [
    ('async', ['--split_w']), ('sync', [])], ids=['async-split_w', 'sync'])
def test_goes_on_from_a_tf1_run(procs, free_ports, small_data, tmp_path,
                                script, flags):
    num_ps = 2 if flags else 1
    common = ['--data_dir=' + small_data, '--logdir=%s' % (tmp_path / 'L'),
              '--export_dir=%s' % (tmp_path / 'E'), *SMALL, *flags]
    tf1 = run(procs, procs.cluster(script, free_ports, *common, '--epochs=2',
                                   num_ps=num_ps))
    [(tf1_step, _, tf1_accuracy)] = EXPORTED.findall(tf1)
    # 10 steps an epoch for each of 3 workers: the async script's global
    # steps, where the run would have ended.
    tf2 = run(procs, procs.cluster('tf2', free_ports, *common, '--epochs=4',
                                   num_ps=num_ps, name='tf2'))
    [(start, source, accuracy)] = STARTING.findall(tf2)
    assert start == tf1_step
    assert source == 'the TF1 checkpoint %s/model.ckpt-%s' % (
        tmp_path / 'L', tf1_step)
    assert abs(float(accuracy) - float(tf1_accuracy)) <= 0.005
    [(step, path, exported)] = EXPORTED.findall(tf2)
    assert step == '120'
    # After each epoch but the last, of 30 global steps (10 of each of 3
    # workers), how far the run is and how long it has left.
    assert re.findall(r'^worker=0, global_step=\d+, \d+ steps/s, epoch (\d) '
                      r'of 4, (?:\d+ min )?\d+ s left$', tf2, re.M) == [
        str(epoch) for epoch in range(int(start) // 30 + 2, 5)], tf2
    assert final_accuracies(tf2) == {0: float(exported)}
    assert float(exported) > 0.9
    assert served_accuracy(path, small_data) == float(exported)
    # Its own checkpoints, from which the same --logdir goes on.
    assert (tmp_path / 'L' / 'tf2' / 'ckpt-120.index').exists()


@pytest.mark.xdist_group('real')  # real processes (pytest.ini)
def test_a_worker_killed_a_ps_restarted_and_ctrl_c(procs, free_ports,
                                                   small_data, tmp_path):
    ports = free_ports(4)
    hosts = ['--data_dir=' + small_data, '--logdir=%s' % (tmp_path / 'L'),
             '--print_every_epochs=1', '--epochs=100000', *SMALL]

    def start(job, index, name=''):
        return procs.script('tf2', job, index, ports[:1], ports[1:], *hosts,
                            name=name)
    ps = start('ps', 0)
    coordinator, worker0, worker1 = (start('worker', i) for i in range(3))
    epoch = r'^worker=0,epoch=\d+,global_step=(\d+)'
    procs.wait_for_output(coordinator, epoch, START_UP)

    # A ps lost: the coordinator waits for it, and starts again from its
    # last checkpoint, once it has one.
    deadline = time.time() + START_UP
    while not (tmp_path / 'L' / 'tf2' / 'checkpoint').exists():
        assert time.time() < deadline, procs.output(coordinator)
        time.sleep(0.1)
    ps.kill()
    procs.wait_for_output(
        coordinator, r'lost the connection to /job:ps/task:0 '
        r'\(localhost:%d\): waiting up to 120 s' % ports[0], START_UP)
    ps = start('ps', 0, name='again')
    restart = procs.wait_for_output(coordinator, STARTING.pattern, START_UP,
                                    count=2)
    assert restart.group(2).startswith('the checkpoint %s' % (
        tmp_path / 'L' / 'tf2' / 'ckpt-'))
    assert int(restart.group(1)) > 0

    # A worker lost: TensorFlow's coordinator runs its steps on the other,
    # and says nothing; ours says it once.
    worker1.kill()
    procs.wait_for_output(
        coordinator, r'/job:worker/task:1 \(localhost:%d\) does not answer: '
        'its steps go to the other workers$' % ports[3], START_UP)
    # It trains on: an epoch more.
    count = len(re.findall(epoch, procs.output(coordinator), re.M))
    procs.wait_for_output(coordinator, epoch, START_UP, count=count + 1)

    # Ctrl-C on the coordinator: it tells the others, which end.
    os.kill(coordinator.pid, signal.SIGINT)
    procs.wait_all([coordinator, worker0, ps], START_UP)
    assert_clean_exit(procs, coordinator, 130)
    assert procs.stderr(coordinator).endswith(
        '/job:chief/task:0: interrupted\n')
    for task, name in ((worker0, '/job:worker/task:0'),
                       (ps, '/job:ps/task:0')):
        assert_clean_exit(procs, task, 0)
        assert procs.stdout(task).endswith(
            '%s: the coordinator, /job:chief/task:0 (localhost:%d), left: '
            '"interrupted"\n' % (name, ports[1]))


@pytest.mark.xdist_group('real')  # real processes (pytest.ini)
def test_a_preemption_loses_no_step(procs, free_ports, small_data, tmp_path):
    """SIGTERM, a scheduler's notice: the ps alone, whose word reaches the
    coordinator, which saves before the ps goes and starts again from that
    checkpoint once the ps is back; then every task at once, the
    coordinator saving as it goes, and the run started again, which goes
    on from there and ends well."""
    ports = free_ports(4)
    common = ['--data_dir=' + small_data, '--logdir=%s' % (tmp_path / 'L'),
              '--print_every_epochs=1', *SMALL]

    def start(name, epochs=100000):
        return [procs.script('tf2', job, index, ports[:1], ports[1:],
                             *common, '--epochs=%d' % epochs, name=name)
                for job, index in (('ps', 0), ('worker', 0), ('worker', 1),
                                   ('worker', 2))]
    ps, coordinator, *workers = start('')
    epoch = r'^worker=0,epoch=\d+,global_step=(\d+)'
    before = int(procs.wait_for_output(coordinator, epoch, START_UP,
                                       count=2).group(1))
    os.kill(ps.pid, signal.SIGTERM)
    procs.wait_all([ps], START_UP)
    assert_clean_exit(procs, ps, 143)
    saved = int(re.fullmatch(
        r'/job:ps/task:0: preempted; the coordinator saved the model at '
        r'global_step=(\d+)\n', procs.stderr(ps)).group(1))
    assert saved >= before
    procs.wait_for_output(
        coordinator, r'^worker=0: /job:ps/task:0 \(localhost:%d\) was '
        r'preempted: saved the model at global_step=%d$' % (ports[0], saved),
        START_UP)
    ps = procs.script('tf2', 'ps', 0, ports[:1], ports[1:], *common,
                      '--epochs=100000', name='again')
    restart = procs.wait_for_output(coordinator, STARTING.pattern, START_UP,
                                    count=2)
    assert restart.group(1) == str(saved)

    # Every task at once.
    count = len(re.findall(epoch, procs.output(coordinator), re.M))
    before = int(procs.wait_for_output(coordinator, epoch, START_UP,
                                       count=count + 2).group(1))
    for task in [ps, coordinator] + workers:
        os.kill(task.pid, signal.SIGTERM)
    procs.wait_all([ps, coordinator] + workers, START_UP)
    saved = int(re.search(r'^worker=0: preempted: saved the model at '
                          r'global_step=(\d+)$', assert_clean_exit(
                              procs, coordinator, 143), re.M).group(1))
    assert saved >= before
    assert procs.stderr(ps).endswith(
        '/job:ps/task:0: preempted; the coordinator saved the model at '
        'global_step=%d\n' % saved)
    assert_clean_exit(procs, ps, 143)
    for i, worker in enumerate(workers):
        assert_clean_exit(procs, worker, 143)
        assert procs.stderr(worker).endswith(
            '/job:worker/task:%d: interrupted\n' % i)
    # Started again, to an epoch past it: 30 global steps an epoch.
    tasks = start('resumed', saved // 30 + 2)
    [(start_step, source, _)] = STARTING.findall(run(procs, (tasks[0],
                                                             tasks[1:])))
    assert start_step == str(saved)
    assert source == 'the checkpoint %s' % (tmp_path / 'L' / 'tf2' /
                                            ('ckpt-%d' % saved))


@pytest.mark.xdist_group('real')  # real processes (pytest.ini)
def test_a_frozen_ps_for_good_for_a_while_and_restarted_at_once(
        procs, free_ports, small_data, tmp_path):
    """Side by side: a ps frozen for good (SIGSTOP) ends every task, the
    coordinator naming the ps, within --stall_timeout and a minute; a ps
    frozen 20 s, then thawed, and a ps killed and started again at once
    (TensorFlow's own kinds of a lost ps among the errors), each run ends
    with every task exit 0 and its final accuracy."""
    runs = {}
    for name, stall in (('forever', 10), ('a-while', 60), ('restarted', 60)):
        ports = free_ports(4)
        flags = ['--data_dir=' + small_data, '--print_every_epochs=1',
                 '--logdir=%s' % (tmp_path / name), '--epochs=%d' % (
                     1000 if name == 'forever' else 40),
                 '--stall_timeout=%d' % stall, '--worker_timeout=10', *SMALL]
        runs[name] = ports, flags, procs.cluster('tf2', lambda n: ports,
                                                 *flags, name=name)
    epoch = r'^worker=0,epoch=2,'
    for name, (ports, flags, (ps, workers)) in runs.items():
        procs.wait_for_output(workers[0], epoch, START_UP)
        if name == 'restarted':
            ps.kill()
            ps.wait()
            runs[name] = ports, flags, (procs.script(
                'tf2', 'ps', 0, ports[:1], ports[1:], *flags,
                name=name + '-again'), workers)
        else:
            os.kill(ps.pid, signal.SIGSTOP)
    stopped = time.time()
    _, _, (ps, workers) = runs['a-while']
    time.sleep(20)
    os.kill(ps.pid, signal.SIGCONT)

    _, _, (frozen, workers) = runs['forever']
    procs.wait_all(workers, 10 + 60, since=stopped)
    line = assert_clean_exit(procs, workers[0], 1)
    assert re.search(r'^/job:chief/task:0: error: no (new global step|answer) '
                     r'for 10 s \(--stall_timeout\); /job:ps/task:0 do\(es\) '
                     r'not answer$', procs.stderr(workers[0]), re.M), line
    for worker in workers[1:]:
        assert re.search(r': the coordinator, /job:chief/task:0 \(\S+\), '
                         r'left: "no (new global step|answer) for 10 s ',
                         assert_clean_exit(procs, worker, 0))
    os.kill(frozen.pid, signal.SIGCONT)
    procs.wait_all([frozen], START_UP)
    for name in ('a-while', 'restarted'):
        _, _, (ps, workers) = runs[name]
        coordinator = run(procs, (ps, workers))
        assert 0 in final_accuracies(coordinator)


# The coordinator's checkpoints, in a process of its own (TensorFlow 2's
# eager variables, on the coordinator alone): saved while another thread
# trains, each is named after the global step it holds; one that cannot be
# written is one line, and the next is saved.
CHECKPOINTS = '''
import sys, threading, time
import tensorflow as tf
from ps_cluster.tf2.checkpoints import Checkpoints
variables = {'w': tf.Variable(tf.zeros([784, 10]), name='w'),
             'b': tf.Variable(tf.zeros([10]), name='b'),
             'global_step': tf.Variable(0, dtype=tf.int64,
                                        name='global_step')}
checkpoints = Checkpoints(sys.argv[1], variables, 'coordinator')
stop = threading.Event()
def train():
    while not stop.is_set():
        variables['w'].assign_add(tf.ones([784, 10]))
        variables['global_step'].assign_add(1)
trainer = threading.Thread(target=train)
trainer.start()
for _ in range(20):
    print(checkpoints.save_now(60))
stop.set()
trainer.join()
for path in checkpoints.manager.checkpoints:
    print('kept', path.rpartition('-')[2], tf.train.load_checkpoint(
        path).get_tensor('global_step/.ATTRIBUTES/VARIABLE_VALUE'))
step = int(variables['global_step'].numpy())
print(step)
tf.io.gfile.makedirs('%s/tf2/ckpt-%d.index/in_the_way' % (sys.argv[1], step))
print(checkpoints.save())
variables['global_step'].assign_add(1)
print(checkpoints.save())
# The epoch's save and a preemption's, at once: one at a time, and one
# checkpoint of the step.
saving, most, save = [], [0], checkpoints.manager.save
def slow_save(**kwargs):
    saving.append(None)
    most[0] = max(most[0], len(saving))
    time.sleep(0.2)
    try:
        return save(**kwargs)
    finally:
        saving.pop()
checkpoints.manager.save = slow_save
variables['global_step'].assign_add(1)
epoch = threading.Thread(target=checkpoints.save)
epoch.start()
time.sleep(0.1)
print(checkpoints.save_now(60))
epoch.join()
print('at once', most[0])
# The variables read, as the coordinator follows them every few seconds;
# then a preemption's read cannot be made (a broken connection): the values
# last read are saved.
variables['global_step'].assign_add(1)
checkpoints.follow()
checkpoints.read = threading.Event().wait
print(checkpoints.save_now(0.5))
print(checkpoints.manager.latest_checkpoint.rpartition('-')[2])
# Without a logdir, nothing to save: the global step alone is read.
print(Checkpoints(None, dict(variables, w=object()),
                  'coordinator').follow())
# A coordinator started again, whose first reads cannot be made: what it
# restored is what it last read.
again = Checkpoints(sys.argv[1], variables, 'coordinator')
again.read = threading.Event().wait
print(again.save_now(0.5))
'''


def test_checkpoints_hold_the_step_they_are_named_after(tmp_path):
    ran = subprocess.run([sys.executable, '-c', CHECKPOINTS, str(tmp_path)],
                         cwd=REPO, capture_output=True, text=True,
                         timeout=START_UP,
                         env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'))
    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.splitlines()
    steps = [int(re.fullmatch(r'saved the model at global_step=(\d+)',
                              line).group(1)) for line in lines[:20]]
    kept = [line.split()[1:] for line in lines[20:-9]]
    assert len(kept) == 5 and all(named == held for named, held in kept)
    assert {int(named) for named, _ in kept} <= set(steps)
    step = int(lines[-9])
    assert lines[-8:] == [
        'None', str(step + 1), 'saved the model at global_step=%d' % (
            step + 2), 'at once 1', 'saved the model at global_step=%d as '
        'last read (no answer within 0.5 s)' % (step + 3), str(step + 3),
        str(step + 3), 'saved the model at global_step=%d as last read (no '
        'answer within 0.5 s)' % (step + 3)]
    assert re.fullmatch(
        r'coordinator: error: cannot save a checkpoint in --logdir=%s \(.+\); '
        r'training goes on' % re.escape(str(tmp_path)),
        [line for line in ran.stderr.splitlines()
         if 'coordinator' in line][0])


# The coordinator's summaries on a full disk, in a process of its own: a
# writer that cannot be made, and one whose flush fails once a write needs
# a new block, are a line each, and the run goes on to its final line.
SUMMARIES = '''
import os, sys
from ps_cluster.tf2.log import Log
full, filling = sys.argv[1:]
def fill(path):
    with open(os.path.join(path, 'filler'), 'wb', buffering=0) as f:
        try:
            while True:
                f.write(bytes(4096))
        except OSError:
            pass
fill(full)
log = Log(0, 0, full, 'coordinator')
log.epoch(1, loss=1.0)
log.final(2, 0.5)
log = Log(0, 0, filling, 'coordinator')
fill(filling)
for step in range(1000):
    log.epoch(step, loss=1.0)
log.final(1000, 0.5)
'''


def test_summaries_on_a_full_disk_cost_the_summaries(tmp_path):
    folders = [tmp_path / 'full', tmp_path / 'filling']
    with small_disks(folders, '64k'):
        ran = subprocess.run([sys.executable, '-c', SUMMARIES,
                              *map(str, folders)], cwd=REPO,
                             capture_output=True, text=True, timeout=START_UP,
                             env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'))
    assert ran.returncode == 0, ran.stderr
    assert [line.split(', train_seconds')[0] for line in
            ran.stdout.splitlines()] == [
        'worker=0, local_steps=2, global_step=2',
        'worker=0, local_steps=1000, global_step=1000']
    assert [line for line in ran.stderr.splitlines()
            if 'coordinator' in line] == [
        'coordinator: error: cannot write summaries in --logdir=%s (%s/%s; '
        'No space left on device); training goes on' % (folder, folder, name)
        for folder, name in zip(folders, re.findall(
            r'(events\.out\.tfevents\.\S+?);', ran.stderr))], ran.stderr
