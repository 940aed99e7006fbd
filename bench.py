"""Benchmarks the parameter-server cluster against a single process.

    python bench.py --data_dir=/usr/share/datasets/fashion-mnist

On the same data and flags it measures:
  - the single-process baseline: the same model, batch and optimizer in one
    tf.Session, at its best thread setting;
  - async and sync with 1 ps + N workers (--workers): aggregate training
    steps per second and its ratio to the baseline, seconds from launch to
    every worker's first step (with and without the Python and TensorFlow
    import), seconds from the last step to every process gone, final test
    accuracy;
  - a straggler: one worker slowed by --straggler_delay_ms a step, for async,
    sync, and sync with one backup worker;
  - seconds to --target_accuracy on the test set, async and sync.
It repeats each cluster run --repeats times, reports medians, prints a
markdown table and writes the figures as JSON to --json.
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

from absl import app, flags

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
import numpy as np  # noqa: E402

import cluster_utils  # noqa: E402
import mnist_data  # noqa: E402
from cluster_utils import tf  # noqa: E402
from compare import ACCURACY, TIMING  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_list('workers', ['1', '2', '3'], 'Cluster sizes to measure.')
flags.DEFINE_integer('repeats', 3, 'Runs of each cluster; medians reported.',
                     lower_bound=1)
flags.DEFINE_integer('baseline_steps', 2000, 'Steps of the baseline.',
                     lower_bound=100)
flags.DEFINE_integer('straggler_delay_ms', 10,
                     'Delay a step of the slow worker in the straggler runs.')
flags.DEFINE_float('target_accuracy', 0.6,
                   'Test accuracy whose time to reach is measured.')
flags.DEFINE_string('json', 'bench.json', 'Where to write the figures.')

REPO = os.path.dirname(os.path.abspath(__file__))
# The cluster tasks get the flags that bench.py shares with them.
SHARED_FLAGS = ['data_dir', 'validation_size', 'learning_rate', 'batch_size',
                'epochs']


def baseline(mnist):
    """Steps per second of one process, at its best thread setting."""
    best = {}
    for intra, inter in ((1, 1), (1, 2), (2, 2), (0, 0)):
        graph = tf.Graph()
        with graph.as_default():
            global_step = tf.train.get_or_create_global_step()
            model = cluster_utils.softmax_regression()
            train_op = tf.train.GradientDescentOptimizer(
                FLAGS.learning_rate).minimize(model.loss,
                                              global_step=global_step)
            init_op = tf.global_variables_initializer()
        config = tf.ConfigProto(intra_op_parallelism_threads=intra,
                                inter_op_parallelism_threads=inter)
        with tf.Session(graph=graph, config=config) as sess:
            sess.run(init_op)
            rng = np.random.default_rng(0)
            steps, started = -100, None  # 100 steps of warm-up
            while steps < FLAGS.baseline_steps:
                for batch_x, batch_y in mnist_data.epoch_batches(
                        mnist.train, FLAGS.batch_size, rng):
                    sess.run([train_op, model.loss, global_step],
                             feed_dict={model.x: batch_x, model.y_: batch_y})
                    steps += 1
                    if steps == 0:
                        started = time.time()
                    if steps == FLAGS.baseline_steps:
                        break
        best['intra=%d,inter=%d' % (intra, inter)] = (
            steps / (time.time() - started))
    setting = max(best, key=best.get)
    return {'steps_per_sec': best[setting], 'threads': setting,
            'all_settings': best}


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
    """One task as a process whose output lines are timestamped as they
    come."""

    def __init__(self, args):
        self.lines = []
        self.proc = subprocess.Popen(
            args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, env=dict(os.environ, PYTHONUNBUFFERED='1'))
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        self.exited = None

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append((time.time(), line.rstrip('\n')))
        self.proc.wait()
        self.exited = time.time()

    def first(self, pattern):
        """(time, match) of the first line matching pattern, or None."""
        for stamp, line in self.lines:
            match = re.match(pattern, line)
            if match:
                return stamp, match
        return None


def run_cluster(script, num_workers, extra=(), slow_worker_flags=(),
                timeout=1800):
    """Runs 1 ps + num_workers workers; returns the figures of the run."""
    ports = free_ports(1 + num_workers)
    cluster = ['--ps=localhost:%d' % ports[0],
               '--worker=' + ','.join('localhost:%d' % p for p in ports[1:])]
    shared = ['--%s=%s' % (name, FLAGS[name].value) for name in SHARED_FLAGS]
    command = [sys.executable, 'mnist_dist_%s.py' % script] + cluster + shared
    launched = time.time()
    ps = Task(command + ['--job_name=ps'])
    workers = [Task(command + ['--job_name=worker', '--task_index=%d' % i]
                    + list(extra)
                    + list(slow_worker_flags if i == num_workers - 1 else []))
               for i in range(num_workers)]
    deadline = launched + timeout
    for task in workers + [ps]:
        task.reader.join(max(0, deadline - time.time()))
        if task.exited is None:
            for t in workers + [ps]:
                t.proc.kill()
            raise RuntimeError('%s %d workers: a task hung' % (script,
                                                               num_workers))
    if any(t.proc.returncode for t in workers + [ps]):
        raise RuntimeError('%s %d workers: a task failed:\n%s' % (
            script, num_workers, '\n'.join(
                line for t in workers + [ps] for _, line in t.lines[-5:])))
    starts = [w.first(r'worker=\d+, starting at')[0] for w in workers]
    ends = [w.first(ACCURACY.pattern) for w in workers]
    return {
        'steps_per_sec': sum(float(w.first(TIMING.pattern)[1].group(5))
                             for w in workers),
        'seconds_to_all_training': max(starts) - launched,
        'seconds_last_step_to_all_gone': max(t.exited for t in workers + [ps])
                                         - max(e[0] for e in ends),
        'accuracy': float(statistics.median(
            float(e[1].group(2)) for e in ends)),
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


def median_of_runs(*args, **kwargs):
    runs = [run_cluster(*args, **kwargs) for _ in range(FLAGS.repeats)]
    return {key: statistics.median(run[key] for run in runs)
            for key in runs[0]}


def import_seconds(processes):
    """Seconds for `processes` Pythons at once to import cluster_utils (and
    so TensorFlow), as the tasks of a cluster do at its start."""
    started = time.time()
    imports = [subprocess.Popen([sys.executable, '-c', 'import cluster_utils'],
                                cwd=REPO, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
               for _ in range(processes)]
    for proc in imports:
        proc.wait()
    return time.time() - started


def time_to_target(script):
    with tempfile.TemporaryDirectory() as logdir:
        launched = time.time()
        run_cluster(script, 3, ['--logdir=' + logdir,
                                '--print_every_epochs=1'])
        return seconds_to_target(logdir, launched)


def report(results):
    base = results['baseline']['steps_per_sec']
    imports = results['import_seconds']
    lines = [
        'Baseline, one process: %.0f steps/s (%s)'
        % (base, results['baseline']['threads']),
        'Python and TensorFlow import, N processes at once: ' + ', '.join(
            '%d: %.1f s' % (n, s) for n, s in sorted(imports.items())),
        '',
        '| run | steps/s | ratio to baseline | s to all training '
        '(less import) | s last step to all gone | test accuracy |',
        '|---|---|---|---|---|---|']
    for name, r in results['clusters'].items():
        processes = 1 + int(name.split(', ')[1].split()[0])
        lines.append('| %s | %.0f | %.2f | %.1f (%.1f) | %.1f | %.4f |' % (
            name, r['steps_per_sec'], r['steps_per_sec'] / base,
            r['seconds_to_all_training'],
            r['seconds_to_all_training'] - imports[processes],
            r['seconds_last_step_to_all_gone'], r['accuracy']))
    lines.append('')
    for script, seconds in results['seconds_to_target'].items():
        lines.append('%s: test accuracy %.2f after %s' % (
            script, FLAGS.target_accuracy,
            'never' if seconds is None else '%.1f s' % seconds))
    return '\n'.join(lines)


def main(_):
    mnist = mnist_data.read_data_sets(FLAGS.data_dir, FLAGS.validation_size,
                                      FLAGS.data_mirror)
    sizes = sorted({1 + int(n) for n in FLAGS.workers} | {4})
    results = {'baseline': baseline(mnist),
               'import_seconds': {n: statistics.median(
                   import_seconds(n) for _ in range(3)) for n in sizes},
               'flags': {name: FLAGS[name].value for name in SHARED_FLAGS},
               'clusters': {}, 'seconds_to_target': {}}
    clusters = results['clusters']
    for script in ('async', 'sync'):
        for n in map(int, FLAGS.workers):
            clusters['%s, %d workers' % (script, n)] = median_of_runs(
                script, n)
    slow = ['--step_delay_ms=%d' % FLAGS.straggler_delay_ms]
    clusters['async, 3 workers, 1 straggler'] = median_of_runs(
        'async', 3, slow_worker_flags=slow)
    clusters['sync, 3 workers, 1 straggler'] = median_of_runs(
        'sync', 3, slow_worker_flags=slow)
    clusters['sync, 3 workers, 1 straggler, 1 backup'] = median_of_runs(
        'sync', 3, ['--replicas_to_aggregate=2'], slow_worker_flags=slow)
    for script in ('async', 'sync'):
        results['seconds_to_target'][script] = time_to_target(script)
    print(report(results))
    with open(FLAGS.json, 'w') as f:
        json.dump(results, f, indent=2)


if __name__ == '__main__':
    app.run(main)
