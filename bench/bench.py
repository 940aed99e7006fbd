"""Benchmarks the parameter-server cluster against a single process.

    python -m bench.bench --data_dir=/usr/share/datasets/fashion-mnist

On the same data and flags it measures:
  - the single-process baseline: the same model, batch and optimizer in one
    tf.Session, at its best thread setting;
  - async and sync with 1 ps + N workers (--workers): aggregate training
    steps per second and its ratio to the baseline, seconds from launch to
    every worker's first step (with and without the import of Python and
    TensorFlow, which a cluster's processes make at once: measured on its
    own), seconds from the last step to every process gone, final test
    accuracy;
  - a straggler among the most --workers (2 or more): one worker slowed by
    --straggler_delay_ms a step, for async, sync, and sync with one backup
    worker;
  - async with the most --workers and each of --ps_tasks ps tasks, w whole
    (round robin) and split a shard per ps (--split_w);
  - TF 2.x's ParameterServerStrategy with a ClusterCoordinator
    (bench/tf2_ps_strategy.py): 1 ps + the most --workers + a coordinator, as
    processes, with each of --tf2_steps_per_function steps per scheduled
    function;
  - the round-trip floor: how many times a second one worker can read a
    variable from a ps, and so what a step costs in round trips;
  - seconds to --target_accuracy on the test set: one process, async, sync
    and the TF 2.x strategy.
The tasks of every cluster are forked from one process that has imported
TensorFlow (bench/forked.py): the cores measure training, not N imports.
It repeats each cluster run and import measurement --repeats times, reports
medians, prints a progress line per run on stderr, then a markdown table with
each cluster's ratio to one process and to the TF 2.x strategy at its best,
and writes the figures as JSON to --json.
"""

import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import types

from absl import app, flags

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
import numpy as np  # noqa: E402

import tensorflow.compat.v1 as tf  # noqa: E402

import mnist_data  # noqa: E402
from bench import forked  # noqa: E402
# The data and training flags that the bench shares with the tasks, with the
# scripts' own defaults.
import mnist_dist_async  # noqa: E402, F401
from launcher.compare import ACCURACY, TIMING  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_list('workers', ['1', '2', '3'], 'Cluster sizes to measure.')
flags.DEFINE_integer('repeats', 3, 'Runs of each cluster and of each import '
                     'measurement; medians reported.', lower_bound=1)
flags.DEFINE_integer('baseline_steps', 2000, 'Steps of the baseline.',
                     lower_bound=100)
flags.DEFINE_list('ps_tasks', ['2', '3'], 'Numbers of ps tasks, 2 or more, '
                  'to measure async with, w whole and split (the async rows '
                  'are on 1 ps, where split is whole).')
flags.register_validator(
    'ps_tasks', lambda value: all(p.isdigit() and int(p) >= 2 for p in value),
    'each must be 2 or more: the async rows are on 1 ps')
flags.DEFINE_integer('straggler_delay_ms', 10,
                     'Delay a step of the slow worker in the straggler runs.')
flags.DEFINE_float('target_accuracy', 0.6,
                   'Test accuracy whose time to reach is measured.')
flags.DEFINE_list('async_steps_per_run', ['10', '50'],
                  'Values of the async script\'s --steps_per_run to measure '
                  'beside the book\'s 1.')
flags.DEFINE_list('tf2_steps_per_function', ['1', '10', '50'],
                  'Steps per scheduled function of the TF 2.x strategy.')
flags.DEFINE_string('json', 'bench.json', 'Where to write the figures.')

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The cluster tasks get the flags that bench.py shares with them.
SHARED_FLAGS = ['data_dir', 'validation_size', 'learning_rate', 'batch_size',
                'epochs']


BENCH_STARTED = time.time()


def progress(what):
    """One line on stderr: what runs now, and how long the bench has run."""
    elapsed = int(time.time() - BENCH_STARTED)
    print('bench: %d:%02d %s' % (elapsed // 60, elapsed % 60, what),
          file=sys.stderr, flush=True)


def single_process():
    """The scripts' model and step, in a graph of its own."""
    graph = tf.Graph()
    with graph.as_default():
        global_step = tf.train.get_or_create_global_step()
        x = tf.placeholder(tf.float32, [None, mnist_data.IMAGE_PIXELS])
        y_ = tf.placeholder(tf.float32, [None, mnist_data.NUM_CLASSES])
        w = tf.Variable(tf.random_normal(
            [mnist_data.IMAGE_PIXELS, mnist_data.NUM_CLASSES]))
        b = tf.Variable(tf.random_normal([mnist_data.NUM_CLASSES]))
        logits = tf.matmul(x, w) + b
        loss = tf.reduce_mean(tf.nn.softmax_cross_entropy_with_logits_v2(
            labels=y_, logits=logits))
        train_op = tf.train.GradientDescentOptimizer(
            FLAGS.learning_rate).minimize(loss, global_step=global_step)
        accuracy = tf.reduce_mean(tf.cast(tf.equal(
            tf.argmax(logits, 1), tf.argmax(y_, 1)), tf.float32))
        init_op = tf.global_variables_initializer()
    return types.SimpleNamespace(
        graph=graph, x=x, y_=y_, fetches=[train_op, loss, global_step],
        accuracy=accuracy, init_op=init_op)


def baseline(mnist):
    """Steps per second of one process at its best thread setting, and the
    seconds its training takes to reach --target_accuracy."""
    best = {}
    for intra, inter in ((1, 1), (1, 2), (2, 2), (0, 0)):
        progress('one process, intra=%d, inter=%d' % (intra, inter))
        model = single_process()
        config = tf.ConfigProto(intra_op_parallelism_threads=intra,
                                inter_op_parallelism_threads=inter)
        with tf.Session(graph=model.graph, config=config) as sess:
            sess.run(model.init_op)
            rng = np.random.default_rng(0)
            steps, started = -100, None  # 100 steps of warm-up
            while steps < FLAGS.baseline_steps:
                for batch_x, batch_y in mnist_data.epoch_batches(
                        mnist.train, FLAGS.batch_size, rng):
                    sess.run(model.fetches,
                             feed_dict={model.x: batch_x, model.y_: batch_y})
                    steps += 1
                    if steps == 0:
                        started = time.time()
                    if steps == FLAGS.baseline_steps:
                        break
        best['intra=%d,inter=%d' % (intra, inter)] = (
            steps / (time.time() - started))
    setting = max(best, key=best.get)
    intra, inter = (int(v.split('=')[1]) for v in setting.split(','))
    progress('one process, time to target')
    seconds, accuracy = single_process_to_target(mnist, intra, inter)
    return {'steps_per_sec': best[setting], 'threads': setting,
            'all_settings': best, 'seconds_to_target': seconds,
            'accuracy': accuracy}


def single_process_to_target(mnist, intra, inter):
    """Seconds of training to --target_accuracy (None: not within --epochs
    epochs), and the test accuracy after --epochs epochs."""
    model = single_process()
    config = tf.ConfigProto(intra_op_parallelism_threads=intra,
                            inter_op_parallelism_threads=inter)
    images, labels = mnist_data.as_float(mnist.test)
    test = {model.x: images, model.y_: labels}
    reached = None
    with tf.Session(graph=model.graph, config=config) as sess:
        sess.run(model.init_op)
        rng = np.random.default_rng(0)
        started = time.time()
        for _ in range(FLAGS.epochs):
            for batch_x, batch_y in mnist_data.epoch_batches(
                    mnist.train, FLAGS.batch_size, rng):
                sess.run(model.fetches,
                         feed_dict={model.x: batch_x, model.y_: batch_y})
            accuracy = float(sess.run(model.accuracy, test))
            if reached is None and accuracy >= FLAGS.target_accuracy:
                reached = time.time() - started
    return reached, accuracy


def free_ports(n):
    """n distinct ports that nothing listens on right now."""
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(('localhost', 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


class Task:
    """One task, forked from a process that imported TensorFlow once
    (bench/forked.py), whose output lines are timestamped as they come:
    `python TARGET ARGS`, or `python -m MODULE ARGS` for '-m MODULE'."""

    POLL_SECS = 0.05

    def __init__(self, target, args):
        self.lines = []
        with tempfile.NamedTemporaryFile('w', suffix='.log',
                                         delete=False) as log:
            self.log = log.name
        self.proc = forked.Task(target, args, dict(os.environ), self.log,
                                self.log)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        self.exited = None

    def _read(self):
        """Its lines as they come, until it has ended and they are read."""
        with open(self.log) as f:
            partial = ''
            while True:
                ended = self.proc.poll() is not None
                read = f.readline()
                partial += read
                if partial.endswith('\n') or (ended and partial and not read):
                    self.lines.append((time.time(), partial.rstrip('\n')))
                    partial = ''
                elif not read and ended:
                    break
                elif not read:
                    time.sleep(self.POLL_SECS)
        self.exited = time.time()
        os.remove(self.log)

    def first(self, pattern):
        """(time, match) of the first line matching pattern, or None."""
        for stamp, line in self.lines:
            match = re.match(pattern, line)
            if match:
                return stamp, match
        return None


def run_cluster(script, num_workers, extra=(), slow_worker_flags=(),
                timeout=1800, num_ps=1):
    """Runs num_ps ps + num_workers workers; returns the figures of the
    run."""
    ports = free_ports(num_ps + num_workers)
    cluster = ['--ps=' + ','.join('localhost:%d' % p for p in ports[:num_ps]),
               '--worker=' + ','.join('localhost:%d' % p
                                      for p in ports[num_ps:])]
    shared = ['--%s=%s' % (name, FLAGS[name].value) for name in SHARED_FLAGS]
    path, flags = 'mnist_dist_%s.py' % script, cluster + shared
    launched = time.time()
    all_ps = [Task(path, flags + ['--job_name=ps', '--task_index=%d' % i])
              for i in range(num_ps)]
    workers = [Task(path, flags + ['--job_name=worker', '--task_index=%d' % i]
                    + list(extra)
                    + list(slow_worker_flags if i == num_workers - 1 else []))
               for i in range(num_workers)]
    deadline = launched + timeout
    for task in workers + all_ps:
        task.reader.join(max(0, deadline - time.time()))
        if task.exited is None:
            for t in workers + all_ps:
                t.proc.kill()
            raise RuntimeError('%s %d workers: a task hung' % (script,
                                                               num_workers))
    if any(t.proc.returncode for t in workers + all_ps):
        raise RuntimeError('%s %d workers: a task failed:\n%s' % (
            script, num_workers, '\n'.join(
                line for t in workers + all_ps for _, line in t.lines[-5:])))
    starts = [w.first(r'worker=\d+, starting at')[0] for w in workers]
    ends = [w.first(ACCURACY.pattern) for w in workers]
    return {
        'steps_per_sec': sum(float(w.first(TIMING.pattern)[1].group(5))
                             for w in workers),
        'seconds_to_all_training': max(starts) - launched,
        'seconds_last_step_to_all_gone': (
            max(t.exited for t in workers + all_ps)
            - max(e[0] for e in ends)),
        'accuracy': float(statistics.median(
            float(e[1].group(2)) for e in ends)),
        'processes': num_ps + num_workers,
    }


def seconds_to_target(logdir, launched_at):
    curves = {}
    for path in sorted(tf.io.gfile.glob(os.path.join(logdir, 'events.*'))):
        for event in tf.train.summary_iterator(path):
            for value in event.summary.value:
                if value.tag == 'test_accuracy':
                    curves.setdefault('test', []).append(
                        (event.wall_time, value.simple_value))
    for wall_time, accuracy in sorted(curves.get('test', [])):
        if accuracy >= FLAGS.target_accuracy:
            return wall_time - launched_at
    return None


def median_of_runs(name, run, *args, **kwargs):
    """Medians of --repeats calls of run(*args, **kwargs)."""
    runs = []
    for repeat in range(FLAGS.repeats):
        progress('%s, run %d of %d' % (name, repeat + 1, FLAGS.repeats))
        runs.append(run(*args, **kwargs))
    return {key: _median([r[key] for r in runs]) for key in runs[0]}


def _median(values):
    """The median of the values that are not None (a run that never
    reached the target), or None if none is."""
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


TF2_LINE = re.compile(r'^tf2: variables on (\S+); steps=(\d+), '
                      r'train_seconds=([0-9.]+), steps_per_sec=([0-9.]+), '
                      r'accuracy=([0-9.]+), target_reached_at=(\S+), ')


def run_tf2(num_workers, steps_per_function, timeout=1800):
    """One run of TF 2.x's ParameterServerStrategy: 1 ps + num_workers
    workers + the coordinator, each a process of tf2_ps_strategy.py."""
    ports = ['localhost:%d' % p for p in free_ports(2 + num_workers)]
    shared = ['--%s=%s' % (name, FLAGS[name].value) for name in SHARED_FLAGS]
    module = '-m bench.tf2_ps_strategy'
    flags = ['--chief=' + ports[0], '--ps=' + ports[1],
             '--worker=' + ','.join(ports[2:]),
             '--target_accuracy=%s' % FLAGS.target_accuracy] + shared
    launched = time.time()
    servers = [Task(module, flags + ['--job_name=ps'])] + [
        Task(module, flags + ['--job_name=worker', '--task_index=%d' % i])
        for i in range(num_workers)]
    chief = Task(module, flags + ['--job_name=chief',
                                  '--steps_per_function=%d'
                                  % steps_per_function])
    chief.reader.join(timeout)
    for task in servers + [chief]:  # the servers serve until killed
        task.proc.kill()
        task.proc.wait()
    found = chief.first(TF2_LINE.pattern)
    if found is None:
        raise RuntimeError('tf2, %d workers: the coordinator failed:\n%s' % (
            num_workers, '\n'.join(line for _, line in chief.lines[-10:])))
    match = found[1]
    reached = match.group(6)
    return {'steps_per_sec': float(match.group(4)),
            'accuracy': float(match.group(5)),
            'seconds_to_target': (None if reached == 'never'
                                  else float(reached) - launched)}


def round_trip_floor(reads=2000):
    """Reads per second of a variable on a ps, by one worker: one gRPC
    round trip each, the floor under any step that needs the ps."""
    ps, worker = ['localhost:%d' % p for p in free_ports(2)]
    server = Task('-m bench.tf2_ps_strategy', ['--job_name=ps', '--ps=' + ps,
                                              '--worker=' + worker])
    try:
        cluster = tf.train.ClusterSpec({'ps': [ps], 'worker': [worker]})
        local = tf.train.Server(cluster, job_name='worker', task_index=0)
        rates = {}
        with tf.Graph().as_default():
            with tf.device('/job:ps/task:0'):
                scalar = tf.Variable(0, dtype=tf.int64)
                w = tf.Variable(tf.zeros(
                    [mnist_data.IMAGE_PIXELS, mnist_data.NUM_CLASSES]))
            config = tf.ConfigProto(device_filters=['/job:ps', '/job:worker'])
            with tf.Session(local.target, config=config) as sess:
                sess.run(tf.global_variables_initializer())
                for name, variable in (('scalar', scalar), ('w', w)):
                    read = variable.read_value()
                    for _ in range(100):  # warm-up
                        sess.run(read)
                    started = time.time()
                    for _ in range(reads):
                        sess.run(read)
                    rates[name] = reads / (time.time() - started)
    finally:
        server.proc.kill()
        server.proc.wait()
    return {'reads_per_sec_scalar': rates['scalar'],
            'reads_per_sec_w': rates['w'],
            'round_trip_ms': 1000 / rates['scalar']}


def import_seconds(processes):
    """Seconds for `processes` Pythons at once to import a script (and so
    TensorFlow), as the tasks of a cluster do at its start."""
    started = time.time()
    imports = [subprocess.Popen([sys.executable, '-c', 'import mnist_dist_async'],
                                cwd=REPO, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
               for _ in range(processes)]
    for proc in imports:
        proc.wait()
    return time.time() - started


def time_to_target(script, num_workers, extra=()):
    progress('%s, %d workers%s, time to target'
             % (script, num_workers, ''.join(' ' + e for e in extra)))
    with tempfile.TemporaryDirectory() as logdir:
        launched = time.time()
        run_cluster(script, num_workers, ['--logdir=' + logdir,
                                          '--print_every_epochs=1',
                                          *extra])
        return seconds_to_target(logdir, launched)


def report(results):
    base = results['baseline']['steps_per_sec']
    tf2_best = max(r['steps_per_sec'] for r in results['tf2'].values())
    imports = results['import_seconds']
    floor = results['floor']
    one_worker = results['clusters'].get('async, 1 workers')
    lines = [
        'One process: %.0f steps/s (%s)'
        % (base, results['baseline']['threads']),
        'Python and TensorFlow import, N processes at once: ' + ', '.join(
            '%d: %.1f s' % (n, s) for n, s in sorted(imports.items())),
        'Round-trip floor, one worker reading from the ps: %.0f reads/s of '
        'a scalar (%.2f ms each), %.0f of w' % (
            floor['reads_per_sec_scalar'], floor['round_trip_ms'],
            floor['reads_per_sec_w'])]
    if one_worker:
        lines.append('An async step of 1 worker + 1 ps costs %.1f round trips'
                     % (floor['reads_per_sec_scalar']
                        / one_worker['steps_per_sec']))
    lines += [
        '',
        '| run | steps/s | ratio to one process | ratio to TF 2.x best '
        '| s to all training (less import) | s last step to all gone '
        '| test accuracy |',
        '|---|---|---|---|---|---|---|']
    for name, r in results['clusters'].items():
        processes = r['processes']
        lines.append('| %s | %.0f | %.2f | %.2f | %.1f (%.1f) | %.1f | %.4f |'
                     % (name, r['steps_per_sec'], r['steps_per_sec'] / base,
                        r['steps_per_sec'] / tf2_best,
                        r['seconds_to_all_training'] + imports[processes],
                        r['seconds_to_all_training'],
                        r['seconds_last_step_to_all_gone'], r['accuracy']))
    for name, r in results['tf2'].items():
        lines.append('| %s | %.0f | %.2f | %.2f | - | - | %.4f |' % (
            name, r['steps_per_sec'], r['steps_per_sec'] / base,
            r['steps_per_sec'] / tf2_best, r['accuracy']))
    lines += ['', 'Seconds to a test accuracy of %.2f (clusters: from launch, '
              'less the import; one process: from its first step):'
              % FLAGS.target_accuracy]
    for name, seconds in results['seconds_to_target'].items():
        lines.append('- %s: %s' % (
            name, 'not within --epochs' if seconds is None
            else '%.1f s' % seconds))
    return '\n'.join(lines)


def main(_):
    tf.logging.set_verbosity(tf.logging.ERROR)  # else the next line warns
    tf.disable_v2_behavior()
    mnist = mnist_data.read_data_sets(FLAGS.data_dir, FLAGS.validation_size,
                                      FLAGS.data_mirror)
    most = max(map(int, FLAGS.workers))
    # A straggler needs another worker beside it.
    straggling = max(most, 2)
    sizes = sorted({1 + int(n) for n in FLAGS.workers} | {1 + straggling}
                   | {int(p) + most for p in FLAGS.ps_tasks})
    results = {'baseline': baseline(mnist), 'import_seconds': {},
               'flags': {name: FLAGS[name].value for name in SHARED_FLAGS},
               'clusters': {}, 'tf2': {}, 'seconds_to_target': {}}
    for n in sizes:
        progress('import, %d processes at once' % n)
        results['import_seconds'][n] = statistics.median(
            import_seconds(n) for _ in range(FLAGS.repeats))
    progress('round-trip floor')
    results['floor'] = round_trip_floor()
    clusters = results['clusters']
    for script in ('async', 'sync'):
        for n in map(int, FLAGS.workers):
            name = '%s, %d workers' % (script, n)
            clusters[name] = median_of_runs(name, run_cluster, script, n)
    for k in map(int, FLAGS.async_steps_per_run):
        name = 'async, %d workers, %d steps/run' % (most, k)
        clusters[name] = median_of_runs(name, run_cluster, 'async', most,
                                        ['--steps_per_run=%d' % k])
    for k in map(int, FLAGS.tf2_steps_per_function):
        name = 'TF 2.x PS strategy, %d workers, %d steps/function' % (most, k)
        results['tf2'][name] = median_of_runs(name, run_tf2, most, k)
    for p in map(int, FLAGS.ps_tasks):
        for split in ([], ['--split_w']):
            name = 'async, %d workers, %d ps%s' % (
                most, p, ', w split' if split else '')
            clusters[name] = median_of_runs(name, run_cluster, 'async', most,
                                            split, num_ps=p)
    slow = ['--step_delay_ms=%d' % FLAGS.straggler_delay_ms]
    for name, script, extra in (
            ('async, %d workers, 1 straggler', 'async', []),
            ('sync, %d workers, 1 straggler', 'sync', []),
            ('sync, %d workers, 1 straggler, 1 backup', 'sync',
             ['--replicas_to_aggregate=%d' % (straggling - 1)])):
        name %= straggling
        clusters[name] = median_of_runs(name, run_cluster, script, straggling,
                                        extra, slow_worker_flags=slow)
    targets = results['seconds_to_target']
    targets['one process'] = results['baseline']['seconds_to_target']
    for script in ('async', 'sync'):
        targets['%s, %d workers' % (script, most)] = time_to_target(
            script, most)
    if FLAGS.async_steps_per_run:
        fastest = max(FLAGS.async_steps_per_run, key=lambda k: clusters[
            'async, %d workers, %s steps/run' % (most, k)]['steps_per_sec'])
        targets['async, %d workers, %s steps/run' % (most, fastest)] = (
            time_to_target('async', most, ['--steps_per_run=' + fastest]))
    best = max(results['tf2'], key=lambda k: results['tf2'][k][
        'steps_per_sec'])
    targets[best] = results['tf2'][best]['seconds_to_target']
    print(report(results))
    with open(FLAGS.json, 'w') as f:
        json.dump(results, f, indent=2)


if __name__ == '__main__':
    app.run(main)
