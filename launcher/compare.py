"""Compares the runs of `launch_local.sh compare` or `straggler`: one table,
one chart, and where each run's model lived.

    python launcher/compare.py RUN_DIR [TARGET_ACCURACY]

reads the runs in RUN_DIR/async, RUN_DIR/sync, RUN_DIR/backup (sync with
a backup worker) and RUN_DIR/tf2 (mnist_dist_tf2.py, whose coordinator's
log is worker0.log), those there, as the launcher leaves them (the workers'
logs, and the chief's TensorBoard events in RUN/logdir); prints a table of
each worker's final accuracy, global steps, training seconds, steps per
second, mean staleness and dropped gradients, with a row for each run as a
whole and the seconds its chief took to first measure TARGET_ACCURACY (by
default the lowest of the runs' final accuracies, as their chiefs measured
them), then where each run's model lived, a line per ps task;
and writes RUN_DIR/comparison.png: loss and accuracy against the global
step and against wall time, how stale the gradients were, and each worker's
share of dropped gradients, for every run.
"""

import collections
import glob
import os
import re
import sys

from absl import app

RUNS = ('async', 'sync', 'backup', 'tf2')
ACCURACY = re.compile(r'^worker=(\d+), final accuracy = ([0-9.]+)$', re.M)
TIMING = re.compile(r'^worker=(\d+), local_steps=(\d+), global_step=(\d+), '
                    r'train_seconds=([0-9.]+), steps_per_sec=([0-9.]+)$',
                    re.M)
PLACEMENT = re.compile(r'^/job:worker/task:0: (/job:ps/.*)$', re.M)
STALENESS = re.compile(r'^worker=(\d+), gradients=(\d+), applied=(\d+), '
                       r'dropped=(\d+), staleness mean=(-?[0-9.]+) '
                       r'\(([-0-9: ]*)\)$', re.M)

Worker = collections.namedtuple('Worker', [
    'accuracy', 'global_step', 'seconds', 'steps_per_sec', 'gradients',
    'staleness', 'dropped', 'counts'])


def counts(text):
    """{staleness: session.runs} of the staleness line's "0:12 1:3"."""
    return collections.Counter({int(s): int(n) for s, n in (
        item.split(':') for item in text.split())})


def read_workers(run_dir):
    """{worker: Worker} of the workers that finished in run_dir; staleness,
    dropped and counts ({staleness: session.runs}) are None in the logs of
    a version that did not measure them."""
    workers = {}
    for path in sorted(glob.glob(os.path.join(run_dir, 'worker*.log'))):
        with open(path) as f:
            log = f.read()
        accuracy, timing = ACCURACY.search(log), TIMING.search(log)
        if not (accuracy and timing):
            continue  # it did not finish
        stale = STALENESS.search(log)
        workers[int(accuracy.group(1))] = Worker(
            float(accuracy.group(2)), int(timing.group(3)),
            float(timing.group(4)), float(timing.group(5)),
            int(stale.group(2)) if stale else 0,
            float(stale.group(5)) if stale else None,
            int(stale.group(4)) if stale else None,
            counts(stale.group(6)) if stale else None)
    return workers


def read_placement(run_dir):
    """Where the model lived in the run in run_dir: the chief's lines of
    ps_cluster/worker/placement.py, one for each ps task."""
    with open(os.path.join(run_dir, 'worker0.log')) as f:
        return PLACEMENT.findall(f.read())


def overall(workers):
    """The run as a whole: the mean accuracy, the last global step, the
    longest training time, the steps per second of all workers together,
    and the staleness of all their gradients."""
    rows = list(workers.values())
    known = [r for r in rows if r.staleness is not None]
    gradients = sum(r.gradients for r in known)
    return Worker(
        sum(r.accuracy for r in rows) / len(rows),
        max(r.global_step for r in rows), max(r.seconds for r in rows),
        sum(r.steps_per_sec for r in rows), gradients,
        sum(r.staleness * r.gradients for r in known) / gradients
        if gradients else None,
        sum(r.dropped for r in known) if known else None,
        sum((r.counts for r in known), collections.Counter())
        if known else None)


def seconds_to(curve, target):
    """The seconds since the start of the first point of curve, [(global
    step, seconds, value)], to reach target; None if none did."""
    return next((seconds for _, seconds, value in curve if value >= target),
                None)


def table(runs, curves, target):
    head = ['run', 'worker', 'accuracy', 'global steps', 'seconds',
            'steps/s', 'staleness', 'dropped', 'seconds to %.4f' % target]
    lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
    for run, workers in runs.items():
        rows = [(str(w), workers[w], None) for w in sorted(workers)]
        to_target = seconds_to(curves[run].get('test_accuracy', []), target)
        rows.append(('all', overall(workers), to_target))
        for name, w, seconds in rows:
            lines.append('| ' + ' | '.join([
                run, name, '%.4f' % w.accuracy, '%d' % w.global_step,
                '%.1f' % w.seconds, '%.1f' % w.steps_per_sec,
                '-' if w.staleness is None else '%.2f' % w.staleness,
                '-' if w.dropped is None else '%d' % w.dropped,
                '-' if seconds is None else '%.1f' % seconds]) + ' |')
    return '\n'.join(lines)


def read_curves(logdir):
    """{tag: [(global step, seconds since the start, value)]} of the chief's
    TensorBoard events."""
    os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
    import tensorflow.compat.v1 as tf
    tf.logging.set_verbosity(tf.logging.ERROR)
    curves, start = {}, None
    for path in sorted(glob.glob(os.path.join(logdir, 'events.out.*'))):
        for event in tf.train.summary_iterator(path):
            start = event.wall_time if start is None else start
            for value in event.summary.value:
                if value.HasField('simple_value'):
                    curves.setdefault(value.tag, []).append(
                        (event.step, event.wall_time - start,
                         value.simple_value))
    return curves


def plot(runs, curves, path):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(3, 2, figsize=(11, 11))
    colors = dict(zip(runs, ('tab:blue', 'tab:orange', 'tab:green',
                             'tab:red')))
    for run, color in colors.items():
        for col in (0, 1):  # against the global step, then wall time
            for row, tags in enumerate(
                    (['loss'], ['validation_accuracy', 'test_accuracy'])):
                for tag in tags:
                    points = curves[run].get(tag, [])
                    axes[row][col].plot(
                        [p[col] for p in points], [p[2] for p in points],
                        color=color, marker='o' if 'test' in tag else None,
                        linestyle='--' if 'validation' in tag else '-',
                        label='%s %s' % (run, tag))
    for col, xlabel in enumerate(('global step', 'seconds since start')):
        axes[1][col].set_xlabel(xlabel)
        for row, ylabel in enumerate(('loss', 'accuracy')):
            axes[row][col].set_ylabel(ylabel)
    # The last row: how stale each run's gradients were, and which worker's
    # were dropped.
    stale, dropped = axes[2]
    width = 0.8 / len(runs)
    for i, (run, workers) in enumerate(runs.items()):
        counts = overall(workers).counts
        if counts:
            total = sum(counts.values())
            shown = sorted(counts)
            stale.plot(shown, [counts[s] / total for s in shown], marker='o',
                       color=colors[run], label=run)
        names = sorted(workers)
        dropped.bar([w + i * width for w in names],
                    [(workers[w].dropped or 0) / max(workers[w].gradients, 1)
                     for w in names], width, color=colors[run], label=run)
    workers = sorted(set().union(*runs.values()))
    dropped.set_xticks([w + width * (len(runs) - 1) / 2 for w in workers],
                       [str(w) for w in workers])
    stale.set_xlabel('staleness (updates of others between read and update)')
    stale.set_ylabel('share of session.runs')
    dropped.set_xlabel('worker')
    dropped.set_ylabel('share of its gradients dropped')
    for ax in axes.flat:
        ax.legend(fontsize='small')
        ax.grid(alpha=0.3)
    fig.suptitle(' versus '.join(runs))
    fig.tight_layout()
    fig.savefig(path, dpi=80)


def main(argv):
    if len(argv) not in (2, 3):
        sys.exit('usage: compare.py RUN_DIR [TARGET_ACCURACY]')
    run_dir = argv[1]
    runs = {run: read_workers(os.path.join(run_dir, run)) for run in RUNS}
    runs = {run: workers for run, workers in runs.items() if workers}
    if not runs:
        sys.exit('compare.py: error: no finished worker logs in %s/{%s}'
                 % (run_dir, ','.join(RUNS)))
    curves = {run: read_curves(os.path.join(run_dir, run, 'logdir'))
              for run in runs}
    finals = [c['test_accuracy'][-1][2] for c in curves.values()
              if c.get('test_accuracy')]
    target = float(argv[2]) if len(argv) == 3 else min(finals, default=1.0)
    print(table(runs, curves, target))
    for run in runs:
        for line in read_placement(os.path.join(run_dir, run)):
            print('%s: %s' % (run, line))
    try:
        plot(runs, curves, os.path.join(run_dir, 'comparison.png'))
    except ImportError as e:
        print('compare.py: no chart without matplotlib (%s): '
              'pip install matplotlib' % e, file=sys.stderr)
        return
    print('chart: %s' % os.path.join(run_dir, 'comparison.png'))


if __name__ == '__main__':
    app.run(main)
