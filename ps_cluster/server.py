"""The config of this task's gRPC server and of every session it opens:
where it may place ops, the GPU it may use, and its thread pools, sized to
its share of the host's CPUs; and, of a GPU, whether one was given to this
process and why TensorFlow cannot use it."""

import glob
import math
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import tensorflow.compat.v1 as tf

from ps_cluster.settings import GPU_MEMORY_FRACTION


# A worker's Watchdog beats and reads the global step through its own
# server, whose inter-op pool runs every op of the worker, each to its end:
# one thread held by a long op of a run (a straggler's wait) would hold the
# beats too, and their deadlines, past the time after which the ps tasks
# count the worker gone.
WORKER_INTER_OP = 2


def session_config(job, index, gpu=None, gpu_memory_fraction=None,
                   threads=0):
    """The config of a task's server and sessions. A worker talks only to
    the ps tasks and itself. `gpu`: the index, among the GPUs this process
    sees, of the one it uses, its memory taken as it needs it, up to
    gpu_memory_fraction of it if given; None: it keeps off the GPUs.
    threads: the size of each of TensorFlow's op pools, intra and inter
    (0: every CPU, its default); a worker's inter-op pool holds at least
    WORKER_INTER_OP threads."""
    config = tf.ConfigProto(
        intra_op_parallelism_threads=threads,
        inter_op_parallelism_threads=threads and (
            max(threads, WORKER_INTER_OP) if job == 'worker' else threads))
    if gpu is None:
        config.device_count['GPU'] = 0
    else:
        # TensorFlow's advice for processes that share a GPU: each grows
        # into what it uses, instead of taking all it may at once.
        config.gpu_options.allow_growth = True
        config.gpu_options.visible_device_list = str(gpu)
        config.gpu_options.per_process_gpu_memory_fraction = (
            gpu_memory_fraction or 0)
    if job == 'worker':
        # Without the filter a worker's session waits for every other
        # worker.
        config.allow_soft_placement = True
        config.device_filters.extend(
            ['/job:ps', '/job:%s/task:%d' % (job, index)])
    return config


# How long each step of a one-call session (call_once()) may take: its
# creation, its run, its close.
CALL_SECS = 5


def call_once(address, task, graph, fetches, secs=CALL_SECS):
    """fetches of graph, run on `task` (/job:J/task:T) at address in a
    session of its own, over a connection of its own: a connection shared
    with the task's other sessions may carry no call for minutes once a
    network cut has healed (TCP's retransmissions back off), and a task's
    last words must get through. Each step of it, the session's creation,
    its run and its close, fails after secs: a frozen task accepts
    connections, and a run's own timeout leaves the others without one.
    None if what it reads is not set up yet, or the task does not
    answer."""
    config = tf.ConfigProto(device_filters=[task],
                            operation_timeout_in_ms=int(secs * 1000))
    config.rpc_options.disable_session_connection_sharing = True
    try:
        with tf.Session('grpc://' + address, graph=graph,
                        config=config) as sess:
            return sess.run(fetches, options=tf.RunOptions(
                timeout_in_ms=int(secs * 1000)))
    except tf.errors.OpError:
        return None


def on_host(addresses, address):
    """Those of `addresses` ('host:port') on the host of `address`, in
    their order."""
    host = address.rpartition(':')[0]
    return [other for other in addresses if other.rpartition(':')[0] == host]


def deal_gpu(users, address, num_gpus):
    """(the index among num_gpus GPUs of the one for the task at address,
    its rank among the tasks of `users` ('host:port', in the cluster's
    order) on its host, their number): round robin over the host's GPUs,
    whatever the number of tasks on the other hosts."""
    here = on_host(users, address)
    rank = here.index(address)
    return rank % num_gpus, rank, len(here)


def check_gpu(target, config, device):
    """(the bytes of `device`, a GPU of the server at target, as config
    sets it, that its task may take; None once a product of matrices, which
    starts cuBLAS, has run there, else the tf.errors.OpError of that run).
    device: its full name, /job:J/replica:0/task:T/device:GPU:0."""
    with tf.Graph().as_default() as graph, tf.device(device):
        # Fed, not a constant that grappler would fold away.
        matrix = tf.placeholder(tf.float32, [8, 8])
        product = tf.matmul(matrix, matrix)
    probe = tf.ConfigProto()
    probe.CopyFrom(config)
    # On that GPU or not at all, and without waiting for the other tasks.
    probe.allow_soft_placement = False
    probe.device_filters[:] = [device.rpartition('/device:')[0]]
    # Listing the devices opens a session of TensorFlow's defaults: one of
    # its own.
    with tf.Session(target, graph=tf.Graph(), config=probe) as sess:
        limit = {d.name: d.memory_limit_bytes
                 for d in sess.list_devices()}.get(device)
    with tf.Session(target, graph=graph, config=probe) as sess:
        try:
            sess.run(product, {matrix: np.ones([8, 8])})
        except tf.errors.OpError as e:
            return limit, e
    return limit, None


# What an environment variable says when it hides every GPU: the container
# runtime's none or void, CUDA's -1 or nothing at all. CUDA's and
# TensorFlow's images set NVIDIA_VISIBLE_DEVICES=all: every GPU of the host,
# if any.
HIDDEN = ('', '-1', 'none', 'void')


def gpu_given(environ=os.environ, devices='/dev'):
    """What says that a GPU was given to this process, in words, or None:
    a GPU named by NVIDIA_VISIBLE_DEVICES (the container runtime's, as
    Kubernetes' device plugin sets it), by CUDA_VISIBLE_DEVICES or by
    Slurm's --gres variables; else an NVIDIA device node. None too where
    one of them hides every GPU."""
    for name in ('NVIDIA_VISIBLE_DEVICES', 'CUDA_VISIBLE_DEVICES',
                 'SLURM_STEP_GPUS', 'SLURM_JOB_GPUS'):
        value = environ.get(name)
        if value is not None and value.strip().lower() in HIDDEN:
            return None
        if value is not None and value.strip().lower() != 'all':
            return '%s=%s' % (name, value)
    nodes = sorted(glob.glob(os.path.join(devices, 'nvidia[0-9]*')))
    return nodes[0] if nodes else None


# TensorFlow's C++ log line: its level, date, time, thread and file:line
# (2.x), or date, time, level and file:line (1.15).
LOG_LINE = re.compile(r'^(?:[IWE]\d{4} [\d:.]+ +\d+ |\d{4}-\d\d-\d\d '
                      r'[\d:.]+: [IWE] )(?:\S*/)?(\S+)\] (.*)$')


def why_no_gpu(timeout=30):
    """TensorFlow's own words for finding no GPU, in a process of its own
    that logs them (this one's log level hides them, and TensorFlow reads
    it once): its lines from CUDA's and the GPU's sources, in a line."""
    try:
        ran = subprocess.run(
            [sys.executable, '-c', 'import tensorflow.compat.v1 as tf; '
             'tf.config.experimental.list_physical_devices("GPU")'],
            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='0',
                     TF_USE_LEGACY_KERAS='1'),
            capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return 'TensorFlow found no GPU'
    said = []
    for line in ran.stderr.splitlines():
        logged = LOG_LINE.match(line)
        words = logged and logged.group(2).rstrip('.')
        if logged and re.match(r'(cu|gpu_)', logged.group(1)) and (
                words not in said):
            said.append(words)
    return '; '.join(said) or 'TensorFlow found no GPU'


# A GPU's own failures as TensorFlow words them, most as a task's server or
# first session makes its CUDA context, and what each is: (pattern, cause,
# what to change).
GPU_FAILURES = [
    (r'out of memory|CUDA_ERROR_OUT_OF_MEMORY',
     'out of memory',
     'fewer tasks a GPU (each holds a CUDA context of some hundreds of '
     'MB), or a cap on each (%s)' % GPU_MEMORY_FRACTION),
    (r'busy or unavailable|CUDA_ERROR_DEVICE_UNAVAILABLE',
     'busy: another process holds it, in exclusive-process mode',
     'one task a GPU, or its default compute mode (nvidia-smi -c DEFAULT)'),
    (r'driver version is insufficient|INSUFFICIENT_DRIVER|DRIVER_MISMATCH|'
     r'COMPAT_NOT_SUPPORTED',
     'its driver is older than the CUDA of TensorFlow',
     'a newer NVIDIA driver, or a TensorFlow of an older CUDA'),
]


def gpu_failure(message):
    """(what went wrong, what to change) of a GPU's own failure that
    TensorFlow's message tells, or None."""
    for pattern, cause, change in GPU_FAILURES:
        if re.search(pattern, message):
            return cause, change
    return None


def size_grpc_client(threads):
    """The gRPC client's pools of the server this process starts next: 64
    completion queues, a thread each, and a pool of every CPU by default,
    whatever the config; TensorFlow reads their sizes from the environment
    as it starts a server. A user's own setting stands."""
    os.environ.setdefault('TF_GRPC_WORKER_CACHE_QUEUES', str(threads))
    os.environ.setdefault('TF_GRPC_WORKER_CACHE_THREADS', str(threads))


def quota_cpus(quota, period):
    """The CPUs a CFS quota of `quota` µs a `period` allows, rounded up;
    None without a quota ('max' in cgroup v2, -1 in v1, or none found)."""
    if quota is None or quota in ('max', '-1'):
        return None
    return max(1, math.ceil(int(quota) / int(period)))


def _cgroup_quota(root):
    """(quota, period) of this process's cgroup, v2 or v1, or (None, None).
    In a container, its own cgroup is the root of what it sees."""
    try:
        entries = [line.split(':', 2) for line in pathlib.Path(
            '/proc/self/cgroup').read_text().splitlines()]
    except OSError:
        return None, None
    for _, controllers, path in entries:
        if controllers == '':  # v2
            names, mount = ['cpu.max'], root
        elif 'cpu' in controllers.split(','):
            names = ['cpu.cfs_quota_us', 'cpu.cfs_period_us']
            mount = os.path.join(root, controllers)
        else:
            continue
        # v2's file holds both numbers; v1 has one file for each.
        for folder in (mount + path, mount):
            try:
                values = [pathlib.Path(folder, name).read_text().split()
                          for name in names]
            except OSError:
                continue
            return tuple(sum(values, [])[:2])
    return None, None


def cpu_share(cluster, address, cgroup_root='/sys/fs/cgroup'):
    """(threads for each pool of the task at address, and why): the CPUs
    this process may use (its affinity mask, or its cgroup's CPU quota
    where that allows fewer), divided among the tasks of cluster ({job:
    ['host:port', ...]}) on its host; at least 1."""
    if hasattr(os, 'sched_getaffinity'):
        cpus, limit = len(os.sched_getaffinity(0)), 'affinity'
    else:  # macOS
        cpus, limit = os.cpu_count(), 'all'
    quota = quota_cpus(*_cgroup_quota(cgroup_root))
    if quota is not None and quota < cpus:
        cpus, limit = quota, 'cgroup quota'
    tasks = len(on_host(sum(cluster.values(), []), address))
    return max(1, cpus // tasks), '%d CPUs (%s) shared by %d tasks on %s' % (
        cpus, limit, tasks, address.rpartition(':')[0])
