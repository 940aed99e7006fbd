"""Where a cluster comes from: host lists (--ps and --worker), TF_CONFIG
(Kubeflow's TFJob, managed services), or Slurm's variables inside a step of
srun. Each source returns a ClusterSpec, or raises ValueError saying what
is wrong."""

import collections
import os
import re

import tensorflow.compat.v1 as tf

from ps_cluster.settings import NUM_PS


class Place(collections.namedtuple('Place', ['cluster', 'job', 'index'])):
    """This task's place: its job and index in `cluster`, a ClusterSpec. An
    evaluator follows the cluster from outside it."""

    @property
    def name(self):
        return '/job:%s/task:%d' % (self.job, self.index)

    @property
    def is_chief(self):
        return self.job == 'worker' and self.index == 0

    def task(self, job, index):
        """Another task of the cluster as the lines name it."""
        return '/job:%s/task:%d (%s)' % (job, index,
                                        self.cluster.task_address(job, index))

    def tasks(self, job):
        """Every task of a job, by index, as the lines name them."""
        return [self.task(job, i) for i in range(self.cluster.num_tasks(job))]


def parse_host_list(value):
    """'h1:p1,h2:p2' -> ['h1:p1', 'h2:p2'], or ValueError saying what is
    wrong."""
    hosts = [h.strip() for h in value.split(',')]
    for host in hosts:
        name, _, port = host.rpartition(':')
        if (not re.fullmatch(r'[\w.-]+|\[[0-9a-fA-F:.]+\]', name)
                or not port.isdigit() or not 0 < int(port) < 65536):
            raise ValueError('%r is not host:port' % host)
    return hosts


def from_host_lists(ps, worker):
    """The cluster of two host lists, 'h1:p1,h2:p2'."""
    return tf.train.ClusterSpec({'ps': parse_host_list(ps),
                                 'worker': parse_host_list(worker)})


def from_tf_config():
    """The cluster of TF_CONFIG, and this task's job and index in it. A
    chief job (TensorFlow 2's shape, a TFJob's Chief, Volcano's chief task)
    is worker 0, the workers after it in order; an evaluator, which
    TF_CONFIG may list, is no task of the cluster, as TensorFlow keeps it
    out."""
    try:
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        jobs = resolver.cluster_spec().as_dict()
        job, index = resolver.task_type, resolver.task_id
    except (KeyError, RuntimeError) as e:
        raise ValueError(e)
    jobs.pop('evaluator', None)
    chief = jobs.pop('chief', [])
    if len(chief) > 1:
        raise ValueError('%d chief tasks: a cluster has one at most'
                         % len(chief))
    if chief:
        jobs['worker'] = chief + jobs.get('worker', [])
        job, index = {'chief': ('worker', 0), 'worker': ('worker', index + 1)
                      }.get(job, (job, index))
    return tf.train.ClusterSpec(jobs), job, index


def check(cluster):
    """ValueError unless the cluster has jobs ps and worker alone, each task
    at an address of its own: a task that listens where the spec puts
    another would serve the wrong devices to the tasks that come to it."""
    if sorted(cluster.jobs) != ['ps', 'worker']:
        raise ValueError('the cluster needs jobs ps and worker (worker 0 is '
                         'the chief; or a chief job), not %s'
                         % ', '.join(sorted(cluster.jobs)))
    addresses = cluster.job_tasks('ps') + cluster.job_tasks('worker')
    for address in addresses:
        if addresses.count(address) > 1:
            raise ValueError('%s is given to two tasks' % address)


def from_slurm(num_ps, port_base, evaluator=False, env=os.environ):
    """The tasks of this srun step where Slurm placed them: the first num_ps
    are the ps, the rest the workers (but the last, with evaluator, which
    is no task of the cluster), each on its node's ports from port_base up;
    and this task's job and index.

    Not TensorFlow's SlurmClusterResolver: it sorts the nodes by name and
    fills them in turn, while Slurm keeps its own node order (node9 before
    node10) and may deal the tasks out in turn (srun -m cyclic), so tasks
    would be given other tasks' hosts.
    """
    try:
        nodes = expand_hostlist(env['SLURM_STEP_NODELIST'])
        counts = expand_tasks_per_node(env['SLURM_STEP_TASKS_PER_NODE'])
        rank = int(env['SLURM_PROCID'])
    except KeyError as e:
        raise ValueError('%s is not set: is this a step of srun?' % e.args[0])
    distribution = re.split('[:,]', env.get('SLURM_DISTRIBUTION', ''))[0]
    placement = slurm_placement(nodes, counts, distribution or 'block')
    hosts = ['%s:%d' % (node, port_base + placement[:i].count(node))
             for i, node in enumerate(placement)]
    here = env.get('SLURMD_NODENAME', placement[rank])
    if here != placement[rank]:
        raise ValueError(
            'task %d runs on %s, but the step\'s nodes %s with %s tasks each '
            '(distribution %s) place it on %s'
            % (rank, here, env['SLURM_STEP_NODELIST'],
               env['SLURM_STEP_TASKS_PER_NODE'], distribution or 'block',
               placement[rank]))
    tasks = hosts[:-1] if evaluator else hosts
    if not num_ps < len(tasks):
        raise ValueError('%s=%d leaves none of the step\'s %d tasks to be '
                         'a worker%s' % (NUM_PS, num_ps, len(hosts),
                                         ' beside the evaluator' if evaluator
                                         else ''))
    cluster = tf.train.ClusterSpec({'ps': tasks[:num_ps],
                                    'worker': tasks[num_ps:]})
    if rank == len(tasks):
        return cluster, 'evaluator', 0
    if rank < num_ps:
        return cluster, 'ps', rank
    return cluster, 'worker', rank - num_ps


# One name of a Slurm host list, with its ranges: node[9-10,12]-ib.
_HOSTS = r'([\w.-]+)(?:\[(\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*)\]([\w.-]*))?'


def expand_hostlist(value):
    """Slurm's 'node[9-10,12],gpu01' -> ['node9', 'node10', 'node12',
    'gpu01'], in its order."""
    if not re.fullmatch('%s(,%s)*' % (_HOSTS, _HOSTS), value):
        raise ValueError('%r is not a Slurm host list' % value)
    hosts = []
    for prefix, ranges, suffix in re.findall(_HOSTS, value):
        if not ranges:
            hosts.append(prefix)
        for item in filter(None, ranges.split(',')):
            first, _, last = item.partition('-')
            hosts += [prefix + str(i).zfill(len(first)) + suffix
                      for i in range(int(first), int(last or first) + 1)]
    return hosts


def expand_tasks_per_node(value):
    """Slurm's '2(x3),1' -> [2, 2, 2, 1]."""
    if not re.fullmatch(r'\d+(\(x\d+\))?(,\d+(\(x\d+\))?)*', value):
        raise ValueError('%r is not a Slurm tasks-per-node list' % value)
    return [int(n) for n, times in re.findall(r'(\d+)(?:\(x(\d+)\))?', value)
            for _ in range(int(times or 1))]


def slurm_placement(nodes, counts, distribution):
    """The node of each task of a step, as Slurm places them: block fills
    each node in turn; cyclic deals one task to each node that has room left,
    round after round."""
    if len(nodes) != len(counts):
        raise ValueError('%d nodes but %d tasks-per-node counts'
                         % (len(nodes), len(counts)))
    if distribution == 'block':
        return [node for node, n in zip(nodes, counts) for _ in range(n)]
    if distribution == 'cyclic':
        return [node for round_ in range(max(counts))
                for node, n in zip(nodes, counts) if round_ < n]
    raise ValueError('tasks of distribution %s cannot be placed from the '
                     'step\'s variables: use srun -m block or -m cyclic'
                     % distribution)
