"""Compares an asynchronous with a synchronous run: one table, one chart.

    python launcher/compare.py RUN_DIR

reads RUN_DIR/async and RUN_DIR/sync as `launch_local.sh compare` leaves them
(the workers' logs, and the chief's TensorBoard events in MODE/logdir),
prints a side-by-side table of final accuracy, global steps, training seconds
and steps per second, per worker and overall, and writes
RUN_DIR/comparison.png: loss and accuracy against the global step and against
wall time, for both modes.
"""

import glob
import os
import re
import sys

from absl import app

MODES = ('async', 'sync')
ACCURACY = re.compile(r'^worker=(\d+), final accuracy = ([0-9.]+)$', re.M)
TIMING = re.compile(r'^worker=(\d+), local_steps=(\d+), global_step=(\d+), '
                    r'train_seconds=([0-9.]+), steps_per_sec=([0-9.]+)$',
                    re.M)


def read_workers(mode_dir):
    """{worker: (accuracy, global_step, train_seconds, steps_per_sec)}"""
    workers = {}
    for path in sorted(glob.glob(os.path.join(mode_dir, 'worker*.log'))):
        with open(path) as f:
            log = f.read()
        for (w, accuracy), (_, _, step, seconds, speed) in zip(
                ACCURACY.findall(log), TIMING.findall(log)):
            workers[int(w)] = (float(accuracy), int(step), float(seconds),
                               float(speed))
    return workers


def overall(workers):
    """Mean accuracy, the last global step, the longest training time, and
    the steps per second of all workers together."""
    rows = list(workers.values())
    return (sum(r[0] for r in rows) / len(rows), max(r[1] for r in rows),
            max(r[2] for r in rows), sum(r[3] for r in rows))


def table(runs):
    head = ['worker'] + ['%s %s' % (mode, what) for mode in MODES for what in
                         ('accuracy', 'global steps', 'seconds', 'steps/s')]
    lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
    names = sorted(set().union(*(runs[m] for m in MODES)))
    rows = [(str(w), [runs[m].get(w) for m in MODES]) for w in names]
    rows.append(('all', [overall(runs[m]) if runs[m] else None
                         for m in MODES]))
    for name, cells in rows:
        values = []
        for cell in cells:
            values += (['%.4f' % cell[0], '%d' % cell[1], '%.1f' % cell[2],
                        '%.1f' % cell[3]] if cell else ['-'] * 4)
        lines.append('| ' + ' | '.join([name] + values) + ' |')
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
                curves.setdefault(value.tag, []).append(
                    (event.step, event.wall_time - start, value.simple_value))
    return curves


def plot(curves, path):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    for mode, color in zip(MODES, ('tab:blue', 'tab:orange')):
        for col in (0, 1):  # against the global step, then wall time
            for row, tags in enumerate(
                    (['loss'], ['validation_accuracy', 'test_accuracy'])):
                for tag in tags:
                    points = curves[mode].get(tag, [])
                    axes[row][col].plot(
                        [p[col] for p in points], [p[2] for p in points],
                        color=color, marker='o' if 'test' in tag else None,
                        linestyle='--' if 'validation' in tag else '-',
                        label='%s %s' % (mode, tag))
    for col, xlabel in enumerate(('global step', 'seconds since start')):
        axes[1][col].set_xlabel(xlabel)
        for row, ylabel in enumerate(('loss', 'accuracy')):
            axes[row][col].set_ylabel(ylabel)
            axes[row][col].legend(fontsize='small')
            axes[row][col].grid(alpha=0.3)
    fig.suptitle('asynchronous versus synchronous updates')
    fig.tight_layout()
    fig.savefig(path, dpi=80)


def main(argv):
    if len(argv) != 2:
        sys.exit('usage: compare.py RUN_DIR')
    run_dir = argv[1]
    runs = {mode: read_workers(os.path.join(run_dir, mode)) for mode in MODES}
    if not any(runs.values()):
        sys.exit('compare.py: error: no finished worker logs in %s/{%s}'
                 % (run_dir, ','.join(MODES)))
    print(table(runs))
    try:
        curves = {mode: read_curves(os.path.join(run_dir, mode, 'logdir'))
                  for mode in MODES}
        plot(curves, os.path.join(run_dir, 'comparison.png'))
    except ImportError as e:
        print('compare.py: no chart without matplotlib (%s): '
              'pip install matplotlib' % e, file=sys.stderr)
        return
    print('chart: %s' % os.path.join(run_dir, 'comparison.png'))


if __name__ == '__main__':
    app.run(main)
