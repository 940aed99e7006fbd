"""Reading TensorFlow's errors (ps_cluster/errors.py): the line that says
what went wrong, the task that was lost, and a parse of error messages in
linear time."""

import time

import pytest
import tensorflow.compat.v1 as tf

from ps_cluster import errors
from ps_cluster.sources import Place



@pytest.mark.parametrize('message, line', [
    ('/x/model.ckpt.index; No space left on device',
     '/x/model.ckpt.index; No space left on device'),
    ("Graph execution error:\n\nDetected at node 'save/SaveV2' defined at "
     "(most recent call last):\n    File \"<stdin>\", line 4\nNode: "
     "'save/SaveV2'\n/x/model.ckpt.data; No space left on device\n"
     "\t [[{{node save/SaveV2}}]]", '/x/model.ckpt.data; No space left on '
                                    'device'),
    # A restore on a worker of a cluster, as the chief met a file of noise.
    ("Graph execution error:\n\nDetected at node 'save/RestoreV2' defined "
     "at (most recent call last):\nNode: 'save/RestoreV2'\nDetected at node "
     "'save/RestoreV2' defined at (most recent call last):\nNode: "
     "'save/RestoreV2'\nFrom /job:worker/replica:0/task:0:\nnot an sstable "
     "(bad magic number)\n\t [[{{node save/RestoreV2}}]]",
     'not an sstable (bad magic number)'),
    # The same, the worker and the ps both failing their part of it: two
    # errors, each with its status and task, between rules.
    ("Graph execution error:\n\nDetected at node 'save/RestoreV2' defined "
     "at (most recent call last):\nNode: 'save/RestoreV2'\n"
     "=====================\nDATA_LOSS: From /job:worker/replica:0/task:0:\n"
     "not an sstable (bad magic number)\n\t [[{{node save/RestoreV2}}]]\n"
     "DATA_LOSS: From /job:ps/replica:0/task:0:\nnot an sstable (bad magic "
     "number)\n\t [[{{node save/RestoreV2}}]]\n=====================",
     'not an sstable (bad magic number)'),
    # TensorFlow 2.21's, of a step of mnist_dist_tf2.py's coordinator as it
    # lost a ps: the stack of where the op was defined comes first.
    ("Graph execution error:\n\nDetected at node while/body/_1/while/mul_1/"
     "_22 defined at (most recent call last):\n  File \"/x/mnist_dist_tf2.py"
     "\", line 224, in <module>\n\n  File \"/x/mnist_dist_tf2.py\", line "
     "155, in train_steps\n\nrecvmsg:Connection reset by peer\n\t [[{{node "
     "while/body/_1/while/mul_1/_22}}]] [Op:__inference_train_steps_512]",
     'recvmsg:Connection reset by peer'),
    # An eager op's, as the TF2 coordinator's save met a full disk.
    ('{{function_node __wrapped__SaveV2_dtypes_5_device_/job:chief/replica:0'
     '/task:0/device:CPU:0}} /x/tf2/ckpt-4950_temp/part-00000-of-00001; No '
     'space left on device [Op:SaveV2]',
     '/x/tf2/ckpt-4950_temp/part-00000-of-00001; No space left on device'),
    # Errors of several ops of a run, numbered: the first.
    ('2 root error(s) found.\n  (0) UNAVAILABLE: Socket closed\n\t '
     '[[{{node cond/Assign}}]]\n  (1) CANCELLED: Cancelled\n0 successful '
     'operations.\n0 derived errors ignored.', 'UNAVAILABLE: Socket closed'),
    # TensorFlow 1.15's, each after its status and task.
    ('2 root error(s) found.\n  (0) Cancelled: From /job:worker/replica:0'
     '/task:1:\nRecvFromRemoteAsync is cancelled.\n  (1) Aborted: From '
     '/job:ps/replica:0/task:0:\nThe same RunGraph (Worker) request was '
     'received twice.', 'RecvFromRemoteAsync is cancelled.'),
])
def test_what_went_wrong(message, line):
    assert errors.what_went_wrong(RuntimeError(message)) == line


# As a worker of a sync run with 2 ps saw ps 1 killed: a live ps that passed
# the error on comes first.
LOST_PS_1 = (
    'Graph execution error:\n\n=====================\nUNAVAILABLE: From '
    '/job:ps/replica:0/task:0:\nrecvmsg:Connection reset by peer\n'
    'Additional GRPC error information from remote target '
    '/job:ps/replica:0/task:1 while calling '
    '/tensorflow.WorkerService/RecvTensor:\n:UNKNOWN:Error received from '
    'peer  {grpc_status:14, grpc_message:"recvmsg:Connection reset by peer"}')


# As a sync worker's run met it: gRPC sent its RunGraph to the ps again
# over a broken connection, and the ps had received the first.
SENT_TWICE = (
    'Graph execution error:\n\n=====================\nCANCELLED: From '
    '/job:worker/replica:0/task:1:\nRecvFromRemoteAsync is cancelled.\n'
    '\t [[{{node read_S35}}]]\nABORTED: From /job:ps/replica:0/task:0:\n'
    'The same RunGraph (Worker) request was received twice.')


@pytest.mark.parametrize('error, lost', [
    (tf.errors.UnavailableError(None, None, LOST_PS_1), True),
    (tf.errors.AbortedError(None, None, 'Session handle is not found'), True),
    (tf.errors.CancelledError(None, None, SENT_TWICE), True),
    # TensorFlow 1.15 numbers a run's errors.
    (tf.errors.CancelledError(None, None, (
        '2 root error(s) found.\n  (0) Cancelled: From /job:worker/replica:0'
        '/task:1:\nRecvFromRemoteAsync is cancelled.\n  (1) Aborted: From '
        '/job:ps/replica:0/task:0:\nThe same RunGraph (Worker) request was '
        'received twice.')), True),
    (tf.errors.CancelledError(None, None, 'Session has been closed.'), False),
    (tf.errors.InvalidArgumentError(None, None, SENT_TWICE), False),
    (None, False),
])
def test_is_lost(error, lost):
    assert errors.is_lost(error) == lost


@pytest.mark.parametrize('missing, line', [
    ((), 'lost the connection to /job:ps/task:1 (b:2)'),
    ({1}, 'lost the connection to /job:ps/task:1 (b:2)'),
    ({0}, 'lost the connection to /job:ps/task:0 (a:1)'),
])
def test_lost_connection(missing, line):
    cluster = tf.train.ClusterSpec({'ps': ['a:1', 'b:2'], 'worker': ['c:3']})
    error = tf.errors.UnavailableError(None, None, LOST_PS_1)
    assert errors.lost_connection(Place(cluster, 'worker', 0), error,
                                  missing) == line


def test_lost_connection_never_names_the_task_that_prints_it():
    # A sync worker's run that its own server failed, the ps frozen.
    cluster = tf.train.ClusterSpec({'ps': ['a:1'], 'worker': ['c:3', 'd:4']})
    error = tf.errors.UnavailableError(None, None, (
        'Additional GRPC error information from remote target '
        '/job:worker/replica:0/task:1 while calling /tensorflow.'
        'WorkerService/RunGraph: Deadline Exceeded'))
    me = Place(cluster, 'worker', 1)
    assert errors.lost_connection(me, error) == (
        'lost the connection to a ps task (a:1)')
    assert errors.lost_connection(me, error, {0}) == (
        'lost the connection to /job:ps/task:0 (a:1)')


def test_error_messages_parse_in_linear_time():
    from tensorflow.python.framework import error_interpolation
    original = error_interpolation.parse_message
    messages = ['', 'no tag', 'a {{node x/y}} b {{function_node f}} c',
                '{{node a}}{{function_node b}}{{node c-1.2}} {{bad tag',
                '{{node a b}} {{colocation_node n}}']
    expected = [original(m) for m in messages]
    try:
        errors.parse_errors_in_linear_time()
        parse = error_interpolation.parse_message
        assert [parse(m) for m in messages] == expected
        started = time.time()
        parse('x' * 1000000 + ' {{node n}}')
        assert time.time() - started < 5  # the original: hours
    finally:
        error_interpolation.parse_message = original
