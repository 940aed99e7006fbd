"""The config of a task's server and sessions (ps_cluster/server.py),
in-process."""

import json
import os

import pytest

from ps_cluster import server, sources

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
import tensorflow.compat.v1 as tf  # noqa: E402

tf.disable_v2_behavior()
import small_model  # noqa: E402


def test_a_ps_keeps_off_the_gpus():
    assert server.session_config('ps', 1) == tf.ConfigProto(
        device_count={'GPU': 0})


def test_a_worker_talks_to_the_ps_and_itself_on_its_own_gpu():
    config = server.session_config('worker', 2, gpu=1,
                                   gpu_memory_fraction=0.3)
    assert list(config.device_filters) == ['/job:ps', '/job:worker/task:2']
    assert config.allow_soft_placement
    # It sees the second of the GPUs its process sees, and takes its
    # memory as it needs it, up to the cap.
    assert config.gpu_options.visible_device_list == '1'
    assert config.gpu_options.allow_growth
    assert config.gpu_options.per_process_gpu_memory_fraction == \
        pytest.approx(0.3)
    assert 'GPU' not in config.device_count
    # No cap: as much as it needs.
    assert server.session_config(
        'worker', 2, gpu=0).gpu_options.per_process_gpu_memory_fraction == 0


def test_a_task_without_a_gpu_keeps_off_them():
    for job in ('worker', 'ps', 'evaluator'):
        config = server.session_config(job, 0, gpu=None,
                                       gpu_memory_fraction=0.3)
        assert config.device_count['GPU'] == 0
        assert config.gpu_options == tf.GPUOptions()
    # An evaluator's sessions are its own, local: no filter.
    assert not server.session_config('evaluator', 0).device_filters


def test_a_ps_asked_to_use_a_gpu_gets_one():
    config = server.session_config('ps', 0, gpu=0)
    assert config.gpu_options.visible_device_list == '0'
    assert 'GPU' not in config.device_count


def gpus_of(cluster, num_gpus):
    """{worker index: its GPU} of a ClusterSpec, every host with num_gpus
    GPUs, the workers using them (--gpu_jobs' default)."""
    workers = cluster.job_tasks('worker')
    return {i: server.deal_gpu(workers, address, num_gpus)[0]
            for i, address in enumerate(workers)}


def test_gpus_dealt_by_rank_on_each_host_from_host_lists():
    # Hosts of 3 and 2 workers, 2 GPUs each: each host's workers round
    # robin over its own GPUs; the ps, on host a, takes none.
    cluster = sources.from_host_lists('a:1', 'a:2,a:3,a:4,b:2,b:3')
    assert gpus_of(cluster, 2) == {0: 0, 1: 1, 2: 0, 3: 0, 4: 1}
    assert server.deal_gpu(cluster.job_tasks('worker'), 'a:4', 2) == (0, 2,
                                                                      3)
    # One GPU a host: all on it.
    assert set(gpus_of(cluster, 1).values()) == {0}


def test_gpus_dealt_by_rank_on_each_host_from_tf_config(monkeypatch):
    # The chief job is worker 0: it and worker 1 (TF_CONFIG's worker 0) on
    # host c, worker 2 alone on host d.
    monkeypatch.setenv('TF_CONFIG', json.dumps({
        'cluster': {'chief': ['c:1'], 'worker': ['c:2', 'd:1'],
                    'ps': ['d:2']}, 'task': {'type': 'worker', 'index': 0}}))
    cluster, job, index = sources.from_tf_config()
    assert (job, index) == ('worker', 1)
    assert gpus_of(cluster, 4) == {0: 0, 1: 1, 2: 0}


def test_gpus_dealt_by_rank_on_each_host_from_slurm():
    # srun -N2 -n8 -m cyclic, 2 ps: the tasks alternate between the nodes,
    # so that node9 holds workers 0, 2 and 4. task_index % num_gpus, as
    # TensorFlow's mnist_replica.py deals them, would put all three on GPU
    # 0 and none on GPU 1.
    env = {'SLURM_STEP_NODELIST': 'node[9-10]',
           'SLURM_STEP_TASKS_PER_NODE': '4(x2)', 'SLURM_PROCID': '0',
           'SLURM_DISTRIBUTION': 'cyclic', 'SLURMD_NODENAME': 'node9'}
    cluster, _, _ = sources.from_slurm(2, 2222, env=env)
    assert cluster.job_tasks('worker')[:3] == [
        'node9:2223', 'node10:2223', 'node9:2224']
    assert gpus_of(cluster, 2) == {0: 0, 1: 0, 2: 1, 3: 1, 4: 0, 5: 0}


def test_a_device_that_cannot_run_a_product_is_said(shared_cluster):
    # A ps's server: a worker's places an op where it can (soft placement),
    # which a GPU that does not fail takes.
    spec = shared_cluster()
    target = small_model.server(spec, 'ps', 0).target
    config = server.session_config('ps', 0)
    cpu = '/job:ps/replica:0/task:0/device:CPU:0'
    limit, failure = server.check_gpu(target, config, cpu)
    assert limit > 0 and failure is None
    # This machine's GPU, if any, is not the ps's: its config keeps it off
    # them.
    limit, failure = server.check_gpu(target, config, cpu.replace('CPU',
                                                                  'GPU'))
    assert limit is None
    assert isinstance(failure, tf.errors.InvalidArgumentError)


def test_each_pool_is_sized_as_given():
    for job in ('ps', 'worker'):
        config = server.session_config(job, 0, threads=3)
        assert config.intra_op_parallelism_threads == 3
        assert config.inter_op_parallelism_threads == 3
    # 0: TensorFlow's default, every CPU.
    assert server.session_config('ps', 0).intra_op_parallelism_threads == 0
    assert server.session_config('worker', 0).inter_op_parallelism_threads == 0
    # A worker's long op leaves its beats a thread.
    config = server.session_config('worker', 0, threads=1)
    assert config.intra_op_parallelism_threads == 1
    assert config.inter_op_parallelism_threads == 2
    assert server.session_config('ps', 0, threads=1
                                 ).inter_op_parallelism_threads == 1


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
    # 4 tasks on node1, 2 on node2: 2 CPUs shared by 4 give each 1 thread,
    # never 0; by 2, 1 each too.
    assert server.cpu_share(CLUSTER, 'node1:2223', no_quota) == (
        1, '2 CPUs (affinity) shared by 4 tasks on node1')
    assert server.cpu_share(CLUSTER, 'node2:2222', no_quota) == (
        1, '2 CPUs (affinity) shared by 2 tasks on node2')
    alone = {'ps': ['node1:2222'], 'worker': ['node2:2223']}
    assert server.cpu_share(alone, 'node1:2222', no_quota)[0] == 2
    # A quota below the mask is the limit; above it, the mask is.
    assert server.cpu_share(alone, 'node1:2222', cgroup_root(
        tmp_path / 'one', 1)) == (1, '1 CPUs (cgroup quota) shared by 1 '
                                     'tasks on node1')
    assert server.cpu_share(alone, 'node1:2222', cgroup_root(
        tmp_path / 'eight', 8)) == (2, '2 CPUs (affinity) shared by 1 tasks '
                                       'on node1')


@pytest.mark.parametrize('environ, nodes, given', [
    # No GPU given: TensorFlow's and CUDA's images set these.
    ({}, [], None),
    ({'NVIDIA_VISIBLE_DEVICES': 'all'}, [], None),
    ({'NVIDIA_VISIBLE_DEVICES': 'void', 'CUDA_VISIBLE_DEVICES': '-1'}, [],
     None),
    ({'NVIDIA_VISIBLE_DEVICES': 'none', 'CUDA_VISIBLE_DEVICES': ''}, [],
     None),
    # Kubernetes' device plugin, by index or UUID; Slurm's --gres.
    ({'NVIDIA_VISIBLE_DEVICES': '0'}, [], 'NVIDIA_VISIBLE_DEVICES=0'),
    ({'NVIDIA_VISIBLE_DEVICES': 'GPU-8a1f'}, [],
     'NVIDIA_VISIBLE_DEVICES=GPU-8a1f'),
    ({'CUDA_VISIBLE_DEVICES': '0,1', 'SLURM_STEP_GPUS': '0,1'}, [],
     'CUDA_VISIBLE_DEVICES=0,1'),
    ({'SLURM_JOB_GPUS': '3'}, [], 'SLURM_JOB_GPUS=3'),
    # A host's device nodes; nvidiactl alone is no GPU.
    ({}, ['nvidiactl', 'nvidia1', 'nvidia0'], 'nvidia0'),
    ({}, ['nvidiactl', 'nvidia-uvm'], None),
    # Every GPU hidden on purpose, on a host that has some.
    ({'CUDA_VISIBLE_DEVICES': '-1'}, ['nvidia0'], None),
    ({'NVIDIA_VISIBLE_DEVICES': 'all', 'CUDA_VISIBLE_DEVICES': ''},
     ['nvidia0'], None),
    ({'NVIDIA_VISIBLE_DEVICES': 'all'}, ['nvidia0'], 'nvidia0'),
])
def test_a_gpu_given_to_a_task(tmp_path, environ, nodes, given):
    for name in nodes:
        (tmp_path / name).write_text('')
    found = server.gpu_given(environ, str(tmp_path))
    assert found == (given and given.replace(
        'nvidia0', str(tmp_path / 'nvidia0')))


# TensorFlow's own texts of a GPU's failures as a server or session makes
# its CUDA context (TF 1.x to 2.x).
@pytest.mark.parametrize('message, cause', [
    ('CUDA runtime implicit initialization on GPU:0 failed. Status: out of '
     'memory', 'out of memory'),
    ('failed initializing StreamExecutor for CUDA device ordinal 0: '
     'Internal: failed call to cuDevicePrimaryCtxRetain: '
     'CUDA_ERROR_OUT_OF_MEMORY: out of memory; total memory reported: '
     '85031485440', 'out of memory'),
    ('CUDA runtime implicit initialization on GPU:0 failed. Status: '
     'all CUDA-capable devices are busy or unavailable',
     'busy: another process holds it, in exclusive-process mode'),
    ('failed initializing StreamExecutor for CUDA device ordinal 0: '
     'INTERNAL: failed call to cuDevicePrimaryCtxRetain: '
     'CUDA_ERROR_DEVICE_UNAVAILABLE: CUDA-capable device(s) is/are busy or '
     'unavailable', 'busy: another process holds it, in exclusive-process '
                    'mode'),
    ('CUDA runtime implicit initialization on GPU:0 failed. Status: CUDA '
     'driver version is insufficient for CUDA runtime version',
     'its driver is older than the CUDA of TensorFlow'),
    ('failed call to cuInit: INTERNAL: CUDA error: Failed call to cuInit: '
     'CUDA_ERROR_SYSTEM_DRIVER_MISMATCH: system has unsupported display '
     'driver / cuda driver combination',
     'its driver is older than the CUDA of TensorFlow'),
    ("Cannot assign a device for operation MatMul: Could not satisfy "
     "explicit device specification '/job:ps/replica:0/task:0/device:GPU:0'",
     None),
])
def test_a_gpus_own_failures(message, cause):
    found = server.gpu_failure(message)
    assert (found and found[0]) == cause
