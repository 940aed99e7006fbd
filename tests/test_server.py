"""The config of a task's server and sessions (ps_cluster/server.py),
in-process."""

import os

import pytest

from ps_cluster import server

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
import tensorflow.compat.v1 as tf  # noqa: E402

tf.disable_v2_behavior()


def test_a_ps_keeps_off_the_gpus():
    assert server.session_config('ps', 1, 0.5) == tf.ConfigProto(
        device_count={'GPU': 0})


def test_a_worker_talks_to_the_ps_and_itself_with_its_share_of_a_gpu():
    config = server.session_config('worker', 2, 0.3)
    assert list(config.device_filters) == ['/job:ps', '/job:worker/task:2']
    assert config.allow_soft_placement
    assert config.gpu_options.per_process_gpu_memory_fraction == \
        pytest.approx(0.3)
    # A worker's GPUs are its own.
    assert 'GPU' not in config.device_count


def test_each_pool_is_sized_as_given():
    for job in ('ps', 'worker'):
        config = server.session_config(job, 0, 0.3, threads=3)
        assert config.intra_op_parallelism_threads == 3
        assert config.inter_op_parallelism_threads == 3
    # 0: TensorFlow's default, every CPU.
    assert server.session_config('ps', 0, 0.3).intra_op_parallelism_threads \
        == 0


def test_a_quota_in_cpus():
    assert server.quota_cpus('150000', '100000') == 2  # rounded up
    assert server.quota_cpus('20000', '100000') == 1
    assert server.quota_cpus('max', '100000') is None  # cgroup v2
    assert server.quota_cpus('-1', '100000') is None  # cgroup v1
    assert server.quota_cpus(None, None) is None


def cgroup_root(tmp_path, quota):
    """A cgroup file system for this process, as it reads its own, with a
    CPU quota of `quota` CPUs (v2, and v1 where this process has a cpu
    controller)."""
    with open('/proc/self/cgroup') as f:
        entries = [line.rstrip('\n').split(':', 2) for line in f]
    for _, controllers, path in entries:
        if controllers == '':
            folder = tmp_path / path.lstrip('/')
            folder.mkdir(parents=True, exist_ok=True)
            (folder / 'cpu.max').write_text('%d 100000\n' % (quota * 100000))
        elif 'cpu' in controllers.split(','):
            folder = tmp_path / controllers / path.lstrip('/')
            folder.mkdir(parents=True, exist_ok=True)
            (folder / 'cpu.cfs_quota_us').write_text('%d\n' % (quota * 100000))
            (folder / 'cpu.cfs_period_us').write_text('100000\n')
    return str(tmp_path)


CLUSTER = {'ps': ['node1:2222', 'node2:2222'],
           'worker': ['node1:2223', 'node1:2224', 'node1:2225', 'node2:2223']}


@pytest.fixture
def two_cpus():
    """This process's affinity: its first two CPUs, for the test's time."""
    before = os.sched_getaffinity(0)
    if len(before) < 2:
        pytest.skip('this process may use only one CPU')
    os.sched_setaffinity(0, sorted(before)[:2])
    yield
    os.sched_setaffinity(0, before)


def test_a_task_takes_its_share_of_the_cpus_it_may_use(tmp_path, two_cpus):
    no_quota = str(tmp_path / 'none')
    assert server.usable_cpus(no_quota) == (2, 'affinity')
    # 4 tasks on node1, 2 on node2: 2 CPUs shared by 4 give each 1 thread,
    # never 0; by 2, 1 each too.
    assert server.cpu_share(CLUSTER, 'node1:2223', no_quota) == (
        1, '2 CPUs (affinity) shared by 4 tasks on node1')
    assert server.cpu_share(CLUSTER, 'node2:2222', no_quota) == (
        1, '2 CPUs (affinity) shared by 2 tasks on node2')
    alone = {'ps': ['node1:2222'], 'worker': ['node2:2223']}
    assert server.cpu_share(alone, 'node1:2222', no_quota)[0] == 2
    # A quota below the mask is the limit; above it, the mask is.
    assert server.usable_cpus(cgroup_root(tmp_path / 'one', 1)) == (
        1, 'cgroup quota')
    assert server.usable_cpus(cgroup_root(tmp_path / 'eight', 8)) == (
        2, 'affinity')
