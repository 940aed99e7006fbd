"""Unit tests of cluster_utils: host lists, Slurm's placement, and the lines
of errors that say what went wrong and which task was lost."""

import pytest
import tensorflow.compat.v1 as tf

import cluster_utils


@pytest.mark.parametrize('value, hosts', [
    ('localhost:9001', ['localhost:9001']),
    ('a:1, b.example.org:2,10.0.0.3:65535',
     ['a:1', 'b.example.org:2', '10.0.0.3:65535']),
    ('[::1]:9001', ['[::1]:9001']),
])
def test_parse_host_list(value, hosts):
    assert cluster_utils.parse_host_list(value) == hosts


@pytest.mark.parametrize('value', [
    '', 'localhost', 'localhost:', ':9001', 'localhost:port',
    'localhost:0', 'localhost:65536', 'a:1,,b:2', 'a:1;b:2'])
def test_parse_host_list_rejects(value):
    with pytest.raises(ValueError, match='is not host:port'):
        cluster_utils.parse_host_list(value)


@pytest.mark.parametrize('value, hosts', [
    ('node[9-10,12],gpu01', ['node9', 'node10', 'node12', 'gpu01']),
    ('n[08-10]-ib', ['n08-ib', 'n09-ib', 'n10-ib']),
])
def test_expand_hostlist(value, hosts):
    assert cluster_utils.expand_hostlist(value) == hosts


@pytest.mark.parametrize('value', ['', 'node[9-', 'a,,b', 'n[1-2'])
def test_expand_hostlist_rejects(value):
    with pytest.raises(ValueError, match='is not a Slurm host list'):
        cluster_utils.expand_hostlist(value)


@pytest.mark.parametrize('distribution, placement', [
    ('block', ['a', 'a', 'a', 'a', 'a', 'b', 'c', 'd']),
    # Measured on Slurm 22.05: srun -N4 -n8 -m cyclic gave 5,1(x3).
    ('cyclic', ['a', 'b', 'c', 'd', 'a', 'a', 'a', 'a']),
])
def test_slurm_placement(distribution, placement):
    assert cluster_utils.slurm_placement(
        ['a', 'b', 'c', 'd'], cluster_utils.expand_tasks_per_node('5,1(x3)'),
        distribution) == placement


def test_slurm_placement_refuses_what_it_cannot_map():
    with pytest.raises(ValueError, match='distribution arbitrary'):
        cluster_utils.slurm_placement(['a'], [1], 'arbitrary')


@pytest.mark.parametrize('message, line', [
    ('/x/model.ckpt.index; No space left on device',
     '/x/model.ckpt.index; No space left on device'),
    ("Graph execution error:\n\nDetected at node 'save/SaveV2' defined at "
     "(most recent call last):\n    File \"<stdin>\", line 4\nNode: "
     "'save/SaveV2'\n/x/model.ckpt.data; No space left on device\n"
     "\t [[{{node save/SaveV2}}]]", '/x/model.ckpt.data; No space left on '
                                    'device'),
])
def test_what_went_wrong(message, line):
    assert cluster_utils.what_went_wrong(RuntimeError(message)) == line


# As a worker of a sync run with 2 ps saw ps 1 killed: a live ps that passed
# the error on comes first.
LOST_PS_1 = (
    'Graph execution error:\n\n=====================\nUNAVAILABLE: From '
    '/job:ps/replica:0/task:0:\nrecvmsg:Connection reset by peer\n'
    'Additional GRPC error information from remote target '
    '/job:ps/replica:0/task:1 while calling '
    '/tensorflow.WorkerService/RecvTensor:\n:UNKNOWN:Error received from '
    'peer  {grpc_status:14, grpc_message:"recvmsg:Connection reset by peer"}')


@pytest.mark.parametrize('missing, line', [
    ((), 'lost the connection to /job:ps/task:1 (b:2)'),
    ({1}, 'lost the connection to /job:ps/task:1 (b:2)'),
    ({0}, 'lost the connection to /job:ps/task:0 (a:1)'),
])
def test_lost_connection(missing, line):
    cluster = tf.train.ClusterSpec({'ps': ['a:1', 'b:2'], 'worker': ['c:3']})
    error = tf.errors.UnavailableError(None, None, LOST_PS_1)
    assert cluster_utils.lost_connection(cluster, error, missing) == line


def test_lost_connection_never_names_the_task_that_prints_it(monkeypatch):
    # A sync worker's run that its own server failed, the ps frozen.
    cluster = tf.train.ClusterSpec({'ps': ['a:1'], 'worker': ['c:3', 'd:4']})
    error = tf.errors.UnavailableError(None, None, (
        'Additional GRPC error information from remote target '
        '/job:worker/replica:0/task:1 while calling /tensorflow.'
        'WorkerService/RunGraph: Deadline Exceeded'))
    monkeypatch.setattr(cluster_utils.FLAGS['job_name'], 'value', 'worker')
    monkeypatch.setattr(cluster_utils.FLAGS['task_index'], 'value', 1)
    assert cluster_utils.lost_connection(cluster, error) == (
        'lost the connection to a ps task (a:1)')
    assert cluster_utils.lost_connection(cluster, error, {0}) == (
        'lost the connection to /job:ps/task:0 (a:1)')
