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
