"""Where the model's variables live: what each ps task holds, and its share
of the model's bytes, which a step reads and sends a gradient of."""

import re


def lines(variables, ps_addresses):
    """One line for each ps task: the variables it holds, their bytes, and
    their share of all of `variables`'; a ps that holds none says so."""
    held = [[] for _ in ps_addresses]
    for variable in variables:
        task = re.search(r'/job:ps/(?:replica:\d+/)?task:(\d+)',
                         variable.device)
        if task:
            held[int(task.group(1))].append(variable)
    size = {v: v.shape.num_elements() * v.dtype.base_dtype.size
            for v in variables}
    total = max(sum(size.values()), 1)
    return ['/job:ps/task:%d (%s) holds %s: %s bytes, %.1f%% of the model'
            % (i, address,
               ', '.join(sorted(v.op.name for v in vs)) or 'nothing',
               format(sum(size[v] for v in vs), ','),
               100 * sum(size[v] for v in vs) / total)
            for i, (address, vs) in enumerate(zip(ps_addresses, held))]
