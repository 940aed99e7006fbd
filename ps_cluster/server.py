"""The config of this task's gRPC server and of every session it opens:
where it may place ops, and its thread pools, sized to its share of the
host's CPUs."""

import math
import os

import tensorflow.compat.v1 as tf


def session_config(job, index, gpu_memory_fraction, threads=0):
    """The ps keeps off the GPUs; a worker talks only to the ps tasks and
    itself, and takes its share of a GPU. threads: the size of each of
    TensorFlow's op pools, intra and inter (0: every CPU, its default)."""
    pools = dict(intra_op_parallelism_threads=threads,
                 inter_op_parallelism_threads=threads)
    if job == 'ps':
        # The ps only holds the variables.
        return tf.ConfigProto(device_count={'GPU': 0}, **pools)
    # Without the filter a worker's session waits for every other worker.
    return tf.ConfigProto(
        allow_soft_placement=True,
        device_filters=['/job:ps', '/job:%s/task:%d' % (job, index)],
        gpu_options=tf.GPUOptions(
            per_process_gpu_memory_fraction=gpu_memory_fraction), **pools)


def size_grpc_client(threads):
    """The gRPC client's pools of the server this process starts next: 64
    completion queues, a thread each, and a pool of every CPU by default,
    whatever the config; TensorFlow reads their sizes from the environment
    as it starts a server. A user's own setting stands."""
    os.environ.setdefault('TF_GRPC_WORKER_CACHE_QUEUES', str(threads))
    os.environ.setdefault('TF_GRPC_WORKER_CACHE_THREADS', str(threads))


def usable_cpus(cgroup_root='/sys/fs/cgroup'):
    """(the CPUs this process may use, what says so): its affinity mask, or
    its cgroup's CPU quota where that allows fewer."""
    if hasattr(os, 'sched_getaffinity'):
        cpus, limit = len(os.sched_getaffinity(0)), 'affinity'
    else:  # macOS
        cpus, limit = os.cpu_count(), 'all'
    quota = quota_cpus(*_cgroup_quota(cgroup_root))
    if quota is not None and quota < cpus:
        cpus, limit = quota, 'cgroup quota'
    return cpus, limit


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
        with open('/proc/self/cgroup') as f:
            entries = [line.rstrip('\n').split(':', 2) for line in f]
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
                values = []
                for name in names:
                    with open(os.path.join(folder, name)) as f:
                        values += f.read().split()
            except OSError:
                continue
            return tuple(values[:2])
    return None, None


def cpu_share(cluster, address, cgroup_root='/sys/fs/cgroup'):
    """(threads for each pool of the task at address, and why): the CPUs
    this process may use, divided among the tasks of cluster ({job:
    ['host:port', ...]}) on its host; at least 1."""
    cpus, limit = usable_cpus(cgroup_root)
    host = address.rpartition(':')[0]
    tasks = sum(other.rpartition(':')[0] == host
                for others in cluster.values() for other in others)
    return max(1, cpus // tasks), '%d CPUs (%s) shared by %d tasks on %s' % (
        cpus, limit, tasks, host)
