"""A SavedModel for serving, made from trained values in a graph of its own:
no device of the cluster in it, and a serving_default signature from images
to class probabilities and the predicted class."""

import numpy as np
import tensorflow.compat.v1 as tf


def export_saved_model(model, values, export_dir, split, pixels):
    """Writes model, its variables set to values ({name: array}), as a
    SavedModel in export_dir, and returns its accuracy on split.

    model(images) builds the logits of float32 images of `pixels` values in
    [0, 1], with variables named as in values.
    """
    with tf.Graph().as_default() as graph, tf.Session(graph=graph) as sess:
        images = tf.placeholder(tf.float32, [None, pixels], name='images')
        logits = model(images)
        probabilities = tf.nn.softmax(logits, name='probabilities')
        classes = tf.argmax(logits, 1, name='classes')
        for variable in tf.global_variables():
            variable.load(values[variable.op.name], sess)
        predicted = sess.run(classes, {images: split.images})
        accuracy = float(np.mean(predicted == np.argmax(split.labels, 1)))
        builder = tf.saved_model.Builder(export_dir)
        builder.add_meta_graph_and_variables(
            sess, [tf.saved_model.SERVING], clear_devices=True,
            signature_def_map={'serving_default': (
                tf.saved_model.predict_signature_def(
                    inputs={'images': images},
                    outputs={'probabilities': probabilities,
                             'classes': classes}))})
        builder.save()
    return accuracy

