"""The SavedModel for serving (ps_cluster/export.py), in-process: it loads
with no cluster, and a second writer of the same model finds it there."""

import os

import numpy as np
import pytest

import mnist_data
from ps_cluster import export

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
import tensorflow.compat.v1 as tf  # noqa: E402

tf.disable_v2_behavior()


def model(images):
    w = tf.Variable(tf.zeros([mnist_data.IMAGE_PIXELS, 10]), name='w')
    b = tf.Variable(tf.zeros([10]), name='b')
    return tf.matmul(images, w) + b


def values(seed):
    rng = np.random.default_rng(seed)
    return {'w': rng.normal(size=(mnist_data.IMAGE_PIXELS, 10)).astype(
        np.float32), 'b': np.zeros(10, np.float32), 'global_step': 30}


def test_one_writer_per_export(tmp_path):
    rng = np.random.default_rng(0)
    split = mnist_data.Split(rng.random((50, mnist_data.IMAGE_PIXELS)),
                             np.eye(10)[rng.integers(0, 10, 50)])
    path = str(tmp_path / '30')
    accuracy = export.export_saved_model(model, values(1), path, split,
                                         mnist_data.IMAGE_PIXELS)
    assert 0 <= accuracy <= 1
    assert os.listdir(tmp_path) == ['30']
    with tf.Graph().as_default(), tf.Session() as sess:
        meta = tf.saved_model.load(sess, [tf.saved_model.SERVING], path)
        signature = meta.signature_def['serving_default']
        classes = sess.run(signature.outputs['classes'].name,
                           {signature.inputs['images'].name: split.images})
    assert np.mean(classes == np.argmax(split.labels, 1)) == accuracy
    # The same model again: found, not written; another one: refused.
    assert export.export_saved_model(model, values(1), path, split,
                                     mnist_data.IMAGE_PIXELS) is None
    with pytest.raises(ValueError, match='holds another model'):
        export.export_saved_model(model, values(2), path, split,
                                  mnist_data.IMAGE_PIXELS)
    assert os.listdir(tmp_path) == ['30']
