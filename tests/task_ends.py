"""A task that ends as its last argument says, for test_cluster_utils.py:
`thread`, a thread of its own fails; `raise`, its main thread raises an
error that is neither ours nor TensorFlow's; `collected`, objects that
raise as they are collected, a lost task's TensorFlow error, another
TensorFlow error and one not TensorFlow's, and then it leaves."""

import gc
import sys
import threading

import tensorflow.compat.v1 as tf
from absl import app

import cluster_utils


class Raises:
    """An object that raises `error` as it is collected."""

    def __init__(self, error):
        self.error = error

    def __del__(self):
        raise self.error


def main(argv):
    task = cluster_utils.start_task(sync=False)
    if argv[-1] == 'thread':
        threading.Thread(target=lambda: 1 / 0, name='a thread').start()
        threading.Event().wait()
    if argv[-1] == 'raise':
        raise RuntimeError('Init operations did not make model ready')
    Raises(tf.errors.UnavailableError(None, None, 'Socket closed'))
    Raises(tf.errors.InvalidArgumentError(None, None, 'no lost task\'s'))
    Raises(ValueError('not ours to end on'))
    gc.collect()
    sys.stdout.flush()
    task.leave()


if __name__ == '__main__':
    app.run(main, flags_parser=cluster_utils.parse_flags)
