"""Clusters from Slurm, on a real Slurm: munge, slurmctld, and one slurmd per
node, each node a network namespace with its own address and a name that
does not sort in Slurm's order (node9 to node12). The repository's sbatch
examples are submitted as a user would, adapted in data dir, paths and
epochs. Root only; skipped, with the reason, where Slurm cannot run."""

import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import time

import pytest

from conftest import (REPO, START_UP, evaluations, final_accuracies,
                      network_hosts, own_lines)

# Not in the fast tier; real processes, in turn with the others (pytest.ini).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group('real')]

NODES = ['node9', 'node10', 'node11', 'node12']
PORT = 2222
# Each task's line: its role, the cluster, and where it runs.
TASK_LINE = re.compile(
    r'^/job:(ps|worker)/task:(\d+): cluster from Slurm: ps (\S+), workers '
    r'(\S+); this task: (\S+) \(Slurm task (\d+) on (\S+)\)$', re.M)

SLURM_CONF = '''\
ClusterName=pstest
SlurmctldHost={controller}({controller_address})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={dir}/munge.socket
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool-%n
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd-%n.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd-%n.log
MailProg=/bin/true
ReturnToService=2
# sbatch --wait polls a job every 2 s, 8 s, then 32 s, unless MinJobAge is
# small: 0 (job records are never purged) keeps it at 2 s.
MinJobAge=0
MpiDefault=none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
# Two GPUs a node, as gres.conf names them: stand-in devices, which Slurm
# hands out as it would a node's /dev/nvidia0 and /dev/nvidia1.
GresTypes=gpu
{nodes}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
'''


class Slurm:
    """A running Slurm cluster: submit() runs a batch script to its end."""

    def __init__(self, folder, hub):
        self.folder, self.hub = folder, hub
        # The venv's python first, as the tasks' `python`.
        self.env = dict(os.environ, SLURM_CONF=os.path.join(folder,
                                                            'slurm.conf'),
                        PATH=os.path.dirname(sys.executable) + ':'
                        + os.environ['PATH'])

    def tasks_left(self):
        """The pids of the live processes this Slurm started: their
        environment names its slurm.conf."""
        mine = ('SLURM_CONF=' + self.env['SLURM_CONF']).encode()
        left = []
        for pid in filter(str.isdigit, os.listdir('/proc')):
            try:
                with open('/proc/%s/environ' % pid, 'rb') as f:
                    if mine in f.read().split(b'\0'):
                        left.append(int(pid))
            except OSError:  # it has ended
                pass
        return left

    def command(self, *args, **kwargs):
        """A Slurm command, run where the controller can be reached."""
        return subprocess.run(['nsenter', '--net=/run/netns/' + self.hub]
                              + list(args), env=self.env,
                              capture_output=True, text=True, **kwargs)

    def submit(self, script, *options, timeout=600):
        """Runs a batch script (text) to its end; returns (exit status of
        the job, its output)."""
        path = os.path.join(self.folder, 'job-%d.sbatch' % time.time_ns())
        with open(path, 'w') as f:
            f.write(script)
        output = path + '.out'
        started = self.command('sbatch', '--parsable', '--wait',
                               '--chdir=' + REPO, '--output=' + output,
                               *options, path, timeout=timeout)
        if not os.path.exists(output):
            pytest.fail('sbatch ran no job: %s' % started.stderr)
        with open(output) as f:
            return started.returncode, f.read()

    def idle_nodes(self):
        result = self.command('sinfo', '-h', '-t', 'idle', '-o', '%D')
        return int(result.stdout.strip() or 0)


@pytest.fixture(scope='module')
def slurm(tmp_path_factory):
    if shutil.which('slurmctld') is None or shutil.which('munged') is None:
        pytest.skip('Slurm is not installed (Debian packages slurm-wlm and '
                    'munge)')
    folder = str(tmp_path_factory.mktemp('slurm'))
    os.makedirs(os.path.join(folder, 'state'))
    with network_hosts(len(NODES)) as ((hub, hub_address), machines):
        # Node names resolve to the nodes' addresses for the tasks, in the
        # mount namespace of each slurmd.
        with open(os.path.join(folder, 'hosts'), 'w') as f:
            f.write('127.0.0.1 localhost\n' + ''.join(
                '%s %s\n' % (address, name)
                for name, (_, address) in zip(NODES, machines)))
        with open(os.path.join(folder, 'munge.key'), 'wb') as f:
            f.write(os.urandom(1024))
        os.chmod(os.path.join(folder, 'munge.key'), 0o400)
        with open(os.path.join(folder, 'slurm.conf'), 'w') as f:
            f.write(SLURM_CONF.format(
                controller=socket.gethostname().split('.')[0],
                controller_address=hub_address, dir=folder,
                nodes='\n'.join(
                    # More CPUs than the machine has: several tasks a node.
                    'NodeName=%s NodeAddr=%s CPUs=8 Gres=gpu:2'
                    % (name, address)
                    for name, (_, address) in zip(NODES, machines))))
        for i in range(2):
            # Character devices, as Slurm asks, of /dev/null's numbers.
            os.mknod(os.path.join(folder, 'nvidia%d' % i),
                     0o600 | stat.S_IFCHR, os.makedev(1, 3))
        with open(os.path.join(folder, 'gres.conf'), 'w') as f:
            f.write('Name=gpu File=%s/nvidia[0-1]\n' % folder)
        conf = os.path.join(folder, 'slurm.conf')
        daemons = [
            ['munged', '--foreground', '--force',
             '--key-file=%s/munge.key' % folder,
             '--socket=%s/munge.socket' % folder,
             '--pid-file=%s/munged.pid' % folder,
             '--log-file=%s/munged.log' % folder,
             '--seed-file=%s/munged.seed' % folder],
            ['nsenter', '--net=/run/netns/' + hub, 'slurmctld', '-D', '-f',
             conf]]
        # A slurmd in `ip netns exec` dies for want of /sys/fs/cgroup: that
        # command remounts /sys.
        daemons += [['nsenter', '--net=/run/netns/' + netns, 'unshare',
                     '--mount', 'sh', '-c',
                     'mount --bind %s/hosts /etc/hosts && exec slurmd -D -f '
                     '%s -N %s' % (folder, conf, name)]
                    for name, (netns, _) in zip(NODES, machines)]
        started = []
        cluster = Slurm(folder, hub)

        def start(argvs, ready):
            """Starts the daemons argvs, then waits until ready()."""
            for argv in argvs:
                started.append(subprocess.Popen(
                    argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                    start_new_session=True))
            deadline = time.time() + START_UP
            while not ready():
                if time.time() > deadline or any(p.poll() is not None
                                                 for p in started):
                    pytest.skip('Slurm did not start here: %s' % tail(
                        folder, 'slurmctld.log'))
                time.sleep(0.2)
        munged, slurmctld, *slurmds = daemons
        try:
            # Each daemon once the one it needs answers.
            start([munged], lambda: os.path.exists(
                os.path.join(folder, 'munge.socket')))
            start([slurmctld],
                  lambda: cluster.command('sinfo', '-h').returncode == 0)
            start(slurmds, lambda: cluster.idle_nodes() == len(NODES))
            yield cluster
        finally:
            cluster.command('scancel', '--full', '--user=root', timeout=30)
            for proc in reversed(started):
                proc.terminate()
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def tail(folder, name):
    try:
        with open(os.path.join(folder, name)) as f:
            return ' / '.join(f.read().splitlines()[-3:])
    except OSError as e:
        return str(e)


def example(name, small_data, tmp_path, gpus=False):
    """An sbatch example as a user would adapt it: the data dir, the log
    dir, and a short run; the GPUs that --gres gives here are stand-ins,
    which TensorFlow cannot use: on the CPU (--gpu_jobs=), unless
    `gpus`."""
    with open(os.path.join(REPO, 'examples', name)) as f:
        script = f.read()
    return (script.replace('$HOME/mnist', small_data)
            .replace('$HOME/runs', str(tmp_path / 'runs'))
            .replace('--epochs=50', '--epochs=3 --validation_size=100'
                     + ('' if gpus else ' --gpu_jobs=')))


def tasks_of(output):
    """{(job, index): (ps list, worker list, address, rank, node)}, from each
    task's cluster line."""
    return {(job, int(index)): (ps, workers, address, int(rank), node)
            for job, index, ps, workers, address, rank, node
            in TASK_LINE.findall(output)}


def assert_placed_where_they_run(output, num_ps, num_workers):
    """Every task printed one cluster line, all the same cluster; each runs
    on the node its own address names, ps tasks first in rank; every worker
    finished, and no task left a traceback."""
    tasks = tasks_of(output)
    assert sorted(tasks) == sorted([('ps', i) for i in range(num_ps)] + [
        ('worker', i) for i in range(num_workers)]), output
    assert len({(ps, workers) for ps, workers, *_ in tasks.values()}) == 1
    for (job, index), (ps, workers, address, rank, node) in tasks.items():
        assert address.split(':')[0] == node, output
        assert rank == (index if job == 'ps' else num_ps + index)
        assert address == (ps if job == 'ps' else workers).split(',')[index]
    assert sorted(final_accuracies(output)) == list(range(num_workers)), output
    assert 'Traceback' not in output
    return tasks


def test_example_on_nodes_that_do_not_sort(slurm, small_data, tmp_path):
    # node9 sorts after node10 by name; Slurm puts tasks 0 and 1 on it. Each
    # example runs its own script: the placement is cluster_utils.py's, the
    # same for both (the sync example's cyclic run below shows it there).
    status, output = slurm.submit(example('slurm-async.sbatch', small_data,
                                          tmp_path))
    assert status == 0, output
    tasks = assert_placed_where_they_run(output, 1, 3)
    assert [tasks[('ps', 0)][4]] + [tasks[('worker', i)][4]
                                    for i in range(3)] == [NODES[0]] * 2 + [
                                        NODES[1]] * 2
    # Each worker sees its node's two GPUs, as --gres=gpu:2 hands them to
    # every task there; --gpu_jobs= keeps it off them.
    assert sorted(re.findall(
        r'^/job:worker/task:(\d+): on the CPU: --gpu_jobs= '
        r'\(CUDA_VISIBLE_DEVICES=(\S+)\)$', output, re.M)) == [
            ('0', '0,1'), ('1', '0,1'), ('2', '0,1')], output
    assert slurm.tasks_left() == []


def test_example_on_one_node(slurm, small_data, tmp_path):
    # Four tasks on one node, node9: ports 2222 to 2225 there.
    status, output = slurm.submit(
        example('slurm-async.sbatch', small_data, tmp_path),
        '--nodelist=node9', '--nodes=1', '--ntasks-per-node=4')
    assert status == 0, output
    tasks = assert_placed_where_they_run(output, 1, 3)
    assert sorted(address for *_, address, _, _ in tasks.values()) == [
        'node9:%d' % (PORT + i) for i in range(4)]
    assert slurm.tasks_left() == []


EVALUATOR_LINE = re.compile(
    r'^/job:evaluator/task:0: cluster from Slurm: ps (\S+), workers (\S+); '
    r'this task follows its checkpoints \(Slurm task (\d+) on (\S+)\)$', re.M)


def test_two_ps_dealt_out_cyclic(slurm, small_data, tmp_path):
    # srun -m cyclic, 7 tasks on 4 nodes: task 0 on node9, 1 on node10, 2 on
    # node11, 3 on node12, 4 on node9 again..., the evaluator on node11.
    status, output = slurm.submit(example('slurm-sync.sbatch', small_data,
                                          tmp_path))
    assert status == 0, output
    tasks = assert_placed_where_they_run(output, 2, 4)
    by_rank = sorted((rank, node) for *_, rank, node in tasks.values())
    assert [node for _, node in by_rank] == NODES + NODES[:2]
    # The one GPU of --gres=gpu:1 for each worker, one a node.
    assert sorted(re.findall(
        r'^/job:worker/task:(\d+): on the CPU: --gpu_jobs= '
        r'\(CUDA_VISIBLE_DEVICES=(\S+)\)$', output, re.M)) == [
            (str(i), '0') for i in range(4)], output
    # The evaluator is no task of the cluster the others share; it measured
    # the run's last step (3 epochs of 10 steps), and exported it, in the
    # chief's place.
    [(ps, workers, rank, node)] = EVALUATOR_LINE.findall(output)
    assert {(ps, workers)} == {(p, w) for p, w, *_ in tasks.values()}
    assert (rank, node) == ('6', 'node11')
    step, accuracy = evaluations(output)[-1]
    assert step == 30, output
    # Every worker ends with the last step's model.
    assert all(abs(accuracy - a) < 1e-6
               for a in final_accuracies(output).values())
    exported = re.findall(r'^(\S+): exported the model at global_step=(\d+)',
                          output, re.M)
    assert exported == [('/job:evaluator/task:0', str(step))], output
    assert slurm.tasks_left() == []


def test_gpus_that_tensorflow_cannot_use_end_the_workers(slurm, small_data,
                                                         tmp_path):
    # The example as it is: its workers given the stand-in GPUs of --gres,
    # which TensorFlow cannot use, end at start-up, each saying so; the ps
    # hears why, and leaves.
    status, output = slurm.submit(example('slurm-async.sbatch', small_data,
                                          tmp_path, gpus=True))
    assert status != 0, output
    given = re.findall(r'^/job:worker/task:(\d): error: given a GPU '
                       r'\(CUDA_VISIBLE_DEVICES=0,1\) that TensorFlow cannot '
                       r'use: .+ or train on the CPU: --gpu_jobs=$', output,
                       re.M)
    assert sorted(given) == ['0', '1', '2'], output
    assert re.search(r'^/job:ps/task:0: every worker has ended; ', output,
                     re.M), output
    assert 'Traceback' not in output
    assert slurm.tasks_left() == []


def test_tasks_started_by_hand_in_a_batch_script(slurm, small_data):
    # The batch script's shell has SLURM_PROCID=0 but is no step of srun:
    # the flags describe the cluster.
    flags = ('--ps=localhost:2222 --worker=localhost:2223,localhost:2224 '
             '--data_dir=%s --epochs=3 --validation_size=100' % small_data)
    # A file of its own for each task: lines that three processes write
    # into one file at once can break each other.
    status, output = slurm.submit(
        '#!/bin/bash\n'
        'logs=$(mktemp -d)\n'
        'for task in ps:0 worker:0 worker:1; do\n'
        '  python mnist_dist_async.py --job_name=${task%%:*} '
        '--task_index=${task#*:} ' + flags + ' > $logs/$task 2>&1 &\n'
        'done\n'
        'wait\n'
        'cat $logs/*; rm -r $logs\n', '--nodes=1')
    assert status == 0, output
    assert len(re.findall(r'^/job:\w+/task:\d: cluster from --ps/--worker',
                          output, re.M)) == 3
    assert sorted(final_accuracies(output)) == [0, 1]
    assert 'Traceback' not in output
    assert slurm.tasks_left() == []


def test_placement_it_cannot_map_ends_every_task(slurm, small_data, tmp_path):
    # An arbitrary distribution (SLURM_HOSTFILE) is not in the step's
    # variables: each task says so in one line, at once.
    hostfile = tmp_path / 'hostfile'
    hostfile.write_text('node10\nnode9\n')
    batch = example('slurm-async.sbatch', small_data, tmp_path).replace(
        '\nsrun ', '\nSLURM_HOSTFILE=%s srun --distribution=arbitrary '
        % hostfile)
    # The job holds the nodes the hostfile names, as srun's arbitrary
    # distribution needs.
    status, output = slurm.submit(batch, '--nodelist=node9,node10',
                                  '--ntasks=2', '--ntasks-per-node=1')
    # Slurm's own record of the job beside its output, should the job's
    # status not be what srun's lines say (seen once, not reproduced).
    assert status != 0, output + slurm.command('scontrol', 'show', 'job',
                                               '--oneliner').stdout
    # At once: no task waited for another to come up.
    assert 'did not come up' not in output
    ours = [line for line in own_lines(output)
            if line.startswith('mnist_dist_async.py:')]
    assert ours == ['mnist_dist_async.py: error: Slurm: tasks of distribution '
                    'arbitrary cannot be placed from the step\'s variables: '
                    'use srun -m block or -m cyclic'] * 2, output
    assert 'Traceback' not in output
    assert slurm.tasks_left() == []
