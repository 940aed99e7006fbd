"""What the tasks of a cluster packed on one host hold, started as a user
starts them (launch_local.sh), at each of --workers async workers:

  - each task's threads, resident memory (RSS) and the memory it holds
    alone (private), the most seen in /proc, sampled twice a second;
  - seconds from the launch to the last worker's first step;
  - the aggregate speed: the workers' steps/s (their closing lines) summed.

    python -m bench.bench_host --data_dir=/usr/share/datasets/fashion-mnist
    python -m bench.bench_host --repo=../before ...   # another checkout

--repeats runs each size several times, the sizes interleaved, and reports
the medians. It prints a markdown table and writes the figures to --json.
"""

import json
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from absl import app, flags

from launcher.compare import TIMING

FLAGS = flags.FLAGS
flags.DEFINE_list('workers', ['3', '8', '16'], 'Cluster sizes to measure.')
flags.DEFINE_integer('repeats', 1, 'Runs of each size, interleaved.',
                     lower_bound=1)
flags.DEFINE_integer('epochs', 1, 'Epochs of each worker.', lower_bound=1)
flags.DEFINE_string('data_dir', '/usr/share/datasets/fashion-mnist',
                    'The data set, in MNIST\'s layout.')
flags.DEFINE_string('repo', os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), 'The checkout whose launch_local.sh runs.')
flags.DEFINE_string('json', 'bench_host.json', 'Where to write the figures.')

def free_base(n):
    """A first port of n in a row that nothing listens on."""
    while True:
        base = random.randrange(20000, 60000 - n)
        try:
            for port in range(base, base + n):
                with socket.socket() as s:
                    s.bind(('localhost', port))
            return base
        except OSError:
            continue


def tasks_of(session):
    """{pid: 'ps' or 'worker'} of the live tasks in a session."""
    tasks = {}
    for pid in filter(str.isdigit, os.listdir('/proc')):
        try:
            with open('/proc/%s/stat' % pid) as f:
                if int(f.read().rsplit(')', 1)[1].split()[3]) != session:
                    continue
            with open('/proc/%s/cmdline' % pid, 'rb') as f:
                argv = f.read().decode().split('\0')
        except (OSError, IndexError):  # it has ended
            continue
        for job in ('ps', 'worker'):
            if '--job_name=' + job in argv:
                tasks[int(pid)] = job
    return tasks


def status(pid):
    """(threads, RSS, private memory) of a live process, or None; in MB.
    Its RSS counts the pages of TensorFlow's libraries that every task
    shares; what it holds alone is private."""
    try:
        with open('/proc/%d/status' % pid) as f:
            fields = dict(line.split(':', 1) for line in f)
        with open('/proc/%d/smaps_rollup' % pid) as f:
            private = sum(int(line.split()[1]) for line in f
                          if line.startswith('Private_'))
        return (int(fields['Threads']), int(fields['VmRSS'].split()[0]) / 1024,
                private / 1024)
    except (OSError, KeyError, ValueError):
        return None


def run(num_workers):
    """The figures of one launch of 1 ps and num_workers async workers."""
    lines = []
    with tempfile.TemporaryDirectory() as run_dir:
        started = time.time()
        launcher = subprocess.Popen(
            ['./launch_local.sh', '-H', '-n', str(num_workers), '-b',
             str(free_base(1 + num_workers)), '-o', run_dir, 'async',
             '--data_dir=' + FLAGS.data_dir, '--epochs=%d' % FLAGS.epochs],
            cwd=FLAGS.repo, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, start_new_session=True,
            env=dict(os.environ, PYTHON=sys.executable))

        def read():
            for line in launcher.stdout:
                lines.append((time.time(), line.rstrip('\n')))
        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        most = {}  # pid: [job, threads, RSS, private], the most seen
        while launcher.poll() is None:
            for pid, job in tasks_of(launcher.pid).items():
                seen = status(pid)
                if seen:
                    most[pid] = [job] + [max(a, b) for a, b in zip(
                        most.get(pid, [job, 0, 0, 0])[1:], seen)]
            time.sleep(0.5)
        reader.join()
    if launcher.returncode:
        sys.exit('bench_host: %d workers: launch_local.sh exited %d:\n%s'
                 % (num_workers, launcher.returncode,
                    '\n'.join(line for _, line in lines[-10:])))
    firsts = [stamp for stamp, line in lines
              if re.match(r'worker=\d+, starting at ', line)]
    # Each worker's closing line: its steps/s last.
    speeds = [float(m.group(5)) for _, line in lines
              for m in [TIMING.match(line)] if m]
    figures = {'seconds_to_first_step': max(firsts) - started,
               'steps_per_sec': sum(speeds)}
    for job in ('ps', 'worker'):
        seen = [task for j, *task in most.values() if j == job]
        for k, name in enumerate(('threads', 'rss_mb', 'private_mb')):
            figures['%s_%s' % (job, name)] = max(task[k] for task in seen)
    return figures


def main(_):
    runs = {int(n): [] for n in FLAGS.workers}
    for repeat in range(FLAGS.repeats):
        for n in runs:
            print('bench_host: %d workers, run %d of %d'
                  % (n, repeat + 1, FLAGS.repeats), file=sys.stderr,
                  flush=True)
            runs[n].append(run(n))
    results = {n: {name: statistics.median(r[name] for r in figures)
                   for name in figures[0]} for n, figures in runs.items()}
    print('| workers | threads: ps, worker | RSS MB: ps, worker | private '
          'MB: ps, worker | s to first step | steps/s, all workers |')
    print('|---|---|---|---|---|---|')
    for n, f in results.items():
        print('| %d | %d, %d | %.0f, %.0f | %.0f, %.0f | %.1f | %.0f |' % (
            n, f['ps_threads'], f['worker_threads'], f['ps_rss_mb'],
            f['worker_rss_mb'], f['ps_private_mb'], f['worker_private_mb'],
            f['seconds_to_first_step'], f['steps_per_sec']))
    with open(FLAGS.json, 'w') as f:
        json.dump({'runs': runs, 'medians': results}, f, indent=2)


if __name__ == '__main__':
    app.run(main)
