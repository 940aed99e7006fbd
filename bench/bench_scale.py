"""What the cluster's liveness costs as the number of workers grows.

    python -m bench.bench_scale --data_dir=/usr/share/datasets/fashion-mnist

For 1 ps + N workers of mnist_dist_async.py (--workers), once every worker
trains, over --seconds it measures:
  - new TCP connections a second, from the kernel's `Tcp: ActiveOpens`
    counter of a private network namespace that holds the cluster alone
    (it runs itself again inside one, `unshare --user --net`, as
    launch_local.sh does);
  - heartbeats a worker a second, from the counters on the ps that the
    heartbeats add to (ps_cluster/liveness.py), read by a session of its own; each is
    one RPC to each ps task, beside one read of the global step.
It prints a markdown table and writes the figures as JSON to --json.
"""

import json
import os
import subprocess
import sys
import time

from absl import app, flags

from bench import bench  # sets TensorFlow's log level before its import
import tensorflow.compat.v1 as tf
from bench.bench import FLAGS, Task, free_ports
from ps_cluster import liveness

FLAGS.set_default('workers', ['3', '8', '16'])
FLAGS.set_default('json', 'bench_scale.json')
flags.DEFINE_float('seconds', 10, 'Seconds of training measured per size.',
                   lower_bound=1)
flags.DEFINE_integer('task_step_delay_ms', 20,
                     'Each worker\'s steps wait this long (--step_delay_ms), '
                     'so that 17 processes share 2 cores and every one of '
                     'them trains.',
                     lower_bound=0)

NETNS = 'BENCH_SCALE_NETNS'


def active_opens():
    """The kernel's count of TCP connections opened from this network
    namespace."""
    with open('/proc/net/snmp') as f:
        tcp = [line.split() for line in f if line.startswith('Tcp:')]
    return int(tcp[1][tcp[0].index('ActiveOpens')])


def measure(num_workers):
    """Figures of 1 ps + num_workers async workers, once all train."""
    ports = free_ports(1 + num_workers)
    cluster = ['--ps=localhost:%d' % ports[0],
               '--worker=' + ','.join('localhost:%d' % p for p in ports[1:])]
    shared = ['--%s=%s' % (name, FLAGS[name].value)
              for name in bench.SHARED_FLAGS if name != 'epochs']
    flags = (['--epochs=100000',
              '--step_delay_ms=%d' % FLAGS.task_step_delay_ms]
             + cluster + shared)
    tasks = [Task('mnist_dist_async.py', flags + ['--job_name=ps'])] + [
        Task('mnist_dist_async.py',
             flags + ['--job_name=worker', '--task_index=%d' % i])
        for i in range(num_workers)]
    try:
        deadline = time.time() + 600
        while not all(t.first(r'worker=\d+, starting at') for t in tasks[1:]):
            if time.time() > deadline or any(t.exited for t in tasks):
                raise RuntimeError('%d workers: not every worker trained:\n%s'
                                   % (num_workers, '\n'.join(
                                       line for t in tasks
                                       for _, line in t.lines[-3:])))
            time.sleep(0.5)
        with tf.Graph().as_default():
            beats = liveness.counters(num_workers, [0])[0][0]
            # Closed before the tasks end: closing waits for the ps.
            with tf.Session('grpc://localhost:%d' % ports[0],
                            config=tf.ConfigProto(
                                device_filters=['/job:ps/task:0'])) as sess:
                sess.run(beats)  # its own connection, before the count
                time.sleep(2)  # past the start-up of the last worker
                started = time.time()
                opens_before, beats_before = active_opens(), sess.run(beats)
                time.sleep(FLAGS.seconds)
                opens_after, beats_after = active_opens(), sess.run(beats)
                seconds = time.time() - started
        if any(t.exited for t in tasks):
            raise RuntimeError('%d workers: a task ended while measured'
                               % num_workers)
    finally:
        for t in tasks:
            t.proc.kill()
        for t in tasks:
            t.proc.wait()
    return {'new_tcp_connections_per_sec': (opens_after - opens_before)
            / seconds,
            'heartbeats_per_worker_per_sec': (beats_after - beats_before).sum()
            / seconds / num_workers}


def report(results):
    lines = ['| workers | new TCP connections/s | heartbeats/worker/s |',
             '|---|---|---|']
    for n, figures in results.items():
        lines.append('| %s | %.1f | %.2f |' % (
            n, figures['new_tcp_connections_per_sec'],
            figures['heartbeats_per_worker_per_sec']))
    print('\n'.join(lines))


def main(_):
    if os.environ.get(NETNS) != '1':
        again = [sys.executable, '-m', 'bench.bench_scale'] + sys.argv[1:]
        os.execvpe('unshare', ['unshare', '--user', '--map-root-user',
                               '--net'] + again,
                   dict(os.environ, **{NETNS: '1'}))
    subprocess.run(['ip', 'link', 'set', 'lo', 'up'], check=True)
    tf.disable_v2_behavior()
    results = {}
    for n in map(int, FLAGS.workers):
        bench.progress('%d workers' % n)
        results[n] = measure(n)
    report(results)
    with open(FLAGS.json, 'w') as f:
        json.dump(results, f, indent=2)


if __name__ == '__main__':
    app.run(main)
