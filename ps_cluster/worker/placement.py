"""Where the model's variables live: what each ps task holds, and its share
of the model's bytes, which a step reads and sends a gradient of."""

import tensorflow.compat.v1 as tf


def lines(variables, ps_tasks):
    """One line for each ps task, ps_tasks being their names by index: the
    variables it holds, their bytes, and their share of all of
    `variables`'; a ps that holds none says so."""
    names = [[] for _ in ps_tasks]
    sizes = [0] * len(ps_tasks)
    for variable in variables:
        device = tf.DeviceSpec.from_string(variable.device)
        if device.job == 'ps':
            names[device.task].append(variable.op.name)
            sizes[device.task] += (variable.shape.num_elements()
                                   * variable.dtype.base_dtype.size)
    total = max(sum(sizes), 1)
    return ['%s holds %s: %s bytes, %.1f%% of the model'
            % (task, ', '.join(sorted(held)) or 'nothing', format(size, ','),
               100 * size / total)
            for task, held, size in zip(ps_tasks, names, sizes)]
