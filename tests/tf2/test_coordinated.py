"""How the servers of a TensorFlow 2 cluster end
(ps_cluster/tf2/coordinated.py), in-process: a worker waits for the
coordinator's word, and takes the one it left on a ps task when it could
not tell the worker before it went."""

import os

import pytest

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
import tensorflow.compat.v1 as tf  # noqa: E402

from ps_cluster.deadlines import Limit  # noqa: E402
from ps_cluster.exits import TaskFailed  # noqa: E402
from ps_cluster.tf2 import coordinated  # noqa: E402
import small_model  # noqa: E402

tf.disable_v2_behavior()

PS, WORKER = '/job:ps/task:0', '/job:worker/task:0'
STARTUP, SILENT = Limit(60, '--startup_timeout'), Limit(60, '--worker_timeout')


@pytest.fixture
def servers(shared_cluster, free_ports):
    """(the worker's Word, the ps tasks, the coordinator: a name and an
    address where nothing listens, as after it left)."""
    cluster = shared_cluster()
    word = coordinated.Word(small_model.server(cluster, 'worker', 0), WORKER)
    ps = {PS: cluster.task_address('ps', 0)}
    return word, ps, ('/job:chief/task:0', 'localhost:%d' % free_ports(1)[0])


def test_a_word_left_on_the_ps_is_the_workers_once_the_coordinator_is_gone(
        servers):
    word, ps, coordinator = servers
    coordinated.tell(ps, coordinated.DONE, 10)
    assert word.wait(coordinator, STARTUP, SILENT, ps) == coordinated.DONE


def test_the_coordinator_learns_which_tasks_it_could_not_tell(servers):
    word, ps, (name, nowhere) = servers
    assert coordinated.tell({**ps, name: nowhere}, coordinated.DONE, 5) == [
        name]
    assert coordinated.tell(ps, coordinated.DONE, 10) == []


def test_a_ps_that_was_preempted_says_nothing_for_the_coordinator(servers):
    word, ps, coordinator = servers
    coordinated.tell(ps, coordinated.PREEMPTED, 10)
    with pytest.raises(TaskFailed, match=r'did not come up within 1 s '
                       r'\(--startup_timeout\)$'):
        word.wait(coordinator, Limit(1, '--startup_timeout'), SILENT,
                  ps)


def test_a_server_sets_no_word_of_its_own_as_it_starts(shared_cluster,
                                                       free_ports):
    # The coordinator may tell a server at any moment of its start: a word
    # the start set would write over the coordinator's.
    cluster = shared_cluster()
    server = small_model.server(cluster, 'worker', 0)
    address = cluster.task_address('worker', 0)
    coordinated.Word(server, WORKER)
    assert coordinated.read(WORKER, address) is None
    coordinated.tell({WORKER: address}, coordinated.DONE, 10)
    nowhere = ('/job:chief/task:0', 'localhost:%d' % free_ports(1)[0])
    assert coordinated.Word(server, WORKER).wait(
        nowhere, STARTUP, SILENT) == coordinated.DONE
