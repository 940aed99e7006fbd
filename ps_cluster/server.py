"""The config of this task's gRPC server and of every session it opens."""

import tensorflow.compat.v1 as tf


def session_config(job, index, gpu_memory_fraction):
    """The ps keeps off the GPUs; a worker talks only to the ps tasks and
    itself, and takes its share of a GPU."""
    if job == 'ps':
        # The ps only holds the variables.
        return tf.ConfigProto(device_count={'GPU': 0})
    # Without the filter a worker's session waits for every other worker.
    return tf.ConfigProto(
        allow_soft_placement=True,
        device_filters=['/job:ps', '/job:%s/task:%d' % (job, index)],
        gpu_options=tf.GPUOptions(
            per_process_gpu_memory_fraction=gpu_memory_fraction))

