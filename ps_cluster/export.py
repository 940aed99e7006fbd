"""A SavedModel for serving, made from trained values in a graph of its own:
no device of the cluster in it, and a serving_default signature from images
to class probabilities and the predicted class."""

import os

import numpy as np
import tensorflow.compat.v1 as tf


def export_saved_model(model, values, export_dir, split, pixels):
    """Writes model, its variables set to values ({name: array}), as a
    SavedModel in export_dir, and returns its accuracy on split; None if
    export_dir holds that model already, ValueError if another. It appears
    whole, by a rename: two tasks may export at once.

    model(images) builds the logits of float32 images of `pixels` values in
    [0, 1], with variables named as in values.
    """
    if not tf.io.gfile.exists(export_dir):
        staging = '%s.tmp-%d' % (export_dir, os.getpid())
        accuracy = _write(model, values, staging, split, pixels)
        try:
            tf.io.gfile.rename(staging, export_dir)
            return accuracy
        except tf.errors.OpError:
            tf.io.gfile.rmtree(staging)
            if not tf.io.gfile.exists(export_dir):
                raise
    if not _holds(export_dir, values):
        raise ValueError('it exists, and holds another model')
    return None


def _holds(export_dir, values):
    """Whether every variable of the SavedModel in export_dir holds its
    value in values (which may name more, the global step)."""
    try:
        reader = tf.train.load_checkpoint(
            os.path.join(export_dir, 'variables', 'variables'))
    except (tf.errors.OpError, ValueError):  # no SavedModel of ours there
        return False
    saved = reader.get_variable_to_shape_map()
    return bool(saved) and all(name in values and np.array_equal(
        reader.get_tensor(name), values[name]) for name in saved)


def _write(model, values, export_dir, split, pixels):
    # On the CPU: a local session of a worker would map GPU:0 to a GPU
    # other than its server's.
    cpu_only = tf.ConfigProto(device_count={'GPU': 0})
    with tf.Graph().as_default() as graph, tf.Session(
            graph=graph, config=cpu_only) as sess:
        images = tf.placeholder(tf.float32, [None, pixels], name='images')
        logits = model(images)
        probabilities = tf.nn.softmax(logits, name='probabilities')
        classes = tf.argmax(logits, 1, name='classes')
        for variable in tf.global_variables():
            variable.load(values[variable.op.name], sess)
        predicted = sess.run(classes, {images: split.images})
        accuracy = float(np.mean(predicted == np.argmax(split.labels, 1)))
        # TensorFlow's own: tag serve, signature serving_default, no devices.
        tf.saved_model.simple_save(sess, export_dir, {'images': images}, {
            'probabilities': probabilities, 'classes': classes})
    return accuracy
