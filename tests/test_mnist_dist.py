"""The two scripts: read as the book's, their markers and their diff; their
global step, in-process; and run, one process per task, 1 ps + 3 workers on
localhost (as a user starts them: test_launch_local.py)."""

import ast
import difflib
import os
import re
import threading

import pytest

from conftest import (REPO, START_UP, final_accuracies, left_running,
                      run_accuracy, script_help, staleness_of)

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
import tensorflow.compat.v1 as tf  # noqa: E402

from small_model import server  # noqa: E402

tf.disable_v2_behavior()

EPOCH_LINE = re.compile(r'^worker=(\d+),epoch=(\d+),global_step=(\d+), '
                        r'local_step=(\d+), loss=([0-9.e+-]+)$', re.M)


def train(procs, free_ports, script, data_dir, *flags,
          timeout=START_UP):
    ps, workers = procs.cluster(script, free_ports, '--data_dir=' + data_dir,
                                *flags)
    procs.wait_all(workers + [ps], timeout)
    outputs = [procs.output(w) for w in workers]
    for proc in workers + [ps]:
        assert proc.returncode == 0, procs.output(proc)
        assert 'Traceback' not in procs.output(proc)
        # Without a GPU, TensorFlow logs cuInit's failure at ERROR unless
        # the scripts keep its C++ logs to FATAL.
        assert not re.search(r'^E\d{4} ', procs.output(proc), re.M)
        assert left_running(proc) == []
    return outputs


@pytest.mark.xdist_group('real')  # real processes (pytest.ini)
@pytest.mark.parametrize('script', ['async', 'sync', 'tf2'])
def test_help_lists_the_flags_and_exits_0(script):
    stdout, stderr, status = script_help(script)
    assert status == 0, stderr
    for flag in ('job_name', 'task_index', 'ps', 'worker', 'logdir',
                 'data_dir', 'epochs', 'learning_rate', 'export_dir'):
        assert re.search(r'^  --%s: ' % flag, stdout, re.M), flag


@pytest.mark.parametrize('script', ['async', 'sync'])
def test_three_workers_learn_small_data(procs, free_ports, small_data, script):
    # 10 steps an epoch; the classes are separable, so accuracy must be high.
    # Async: 20 ms a step, 1.2 s a worker: the others, which find the model
    # within a second of each other, train beside each other.
    outputs = train(procs, free_ports, script, small_data, '--epochs=6',
                    '--validation_size=100', '--learning_rate=0.5',
                    '--print_every_epochs=2',
                    *(['--step_delay_ms=20'] if script == 'async' else []))
    for i, output in enumerate(outputs):
        accuracy = final_accuracies(output)
        assert list(accuracy) == [i]
        epochs = [(int(e), int(local)) for w, e, _, local, _
                  in EPOCH_LINE.findall(output)]
        assert all(w == str(i) for w, *_ in EPOCH_LINE.findall(output))
        if script == 'async':  # every worker walks every epoch itself
            assert epochs == [(1, 20), (3, 40), (5, 60)]
        else:  # it stops when the shared global step reaches 6 epochs
            assert epochs == [(e, 10 * (e + 1)) for e, _ in epochs]
    assert run_accuracy(outputs, script) > 0.9
    staleness = [staleness_of(o) for o in outputs]
    if script == 'async':
        # Global steps count every worker's updates: 3 x 60 in all.
        last = [int(EPOCH_LINE.findall(o)[-1][2]) for o in outputs]
        assert max(last) == 180
        # Each update counted once, at most 3 updates stale on average (2
        # others); a worker that starts after the others may train alone.
        for gradients, applied, dropped, mean, counts in staleness:
            assert gradients == applied == sum(counts.values()) == 60
            assert mean < 3
        assert sum(s[3] for s in staleness) > 0
    else:
        # One update per step of all the workers; all end on the same one,
        # with the same variables.
        assert len({final_accuracies(o)[i]
                    for i, o in enumerate(outputs)}) == 1
        # Only gradients of staleness 0 are applied: 60 updates of 3.
        for gradients, applied, dropped, mean, counts in staleness:
            assert applied == counts.get(0, 0)
            assert applied + dropped == gradients == sum(counts.values())
        assert sum(s[1] for s in staleness) >= 60 * 3


def made_as_in(script, name):
    """The statement of the script that makes variable `name`: the block
    around its assignment where that is the block's only line."""
    with open(os.path.join(REPO, 'mnist_dist_%s.py' % script)) as f:
        tree = ast.parse(f.read())
    for block in ast.walk(tree):
        body = getattr(block, 'body', None)
        for statement in body if isinstance(body, list) else []:
            if (isinstance(statement, ast.Assign)
                    and [t.id for t in statement.targets
                         if isinstance(t, ast.Name)] == [name]):
                whole = isinstance(block, ast.With) and len(block.body) == 1
                return ast.unparse(block if whole else statement)
    raise LookupError(name)


def test_the_global_step_counts_every_update(shared_cluster):
    # Many updates at once on the ps, as many workers make them: each adds
    # its one to the global step as the scripts make it (the same lines in
    # both).
    made_in = made_as_in('async', 'global_step')
    assert made_as_in('sync', 'global_step') == made_in
    cluster = shared_cluster(1, 1)
    servers = [server(cluster, job, 0) for job in ('ps', 'worker')]
    made = {'tf': tf}
    with tf.Graph().as_default():
        with tf.device(tf.train.replica_device_setter(
                worker_device='/job:worker/task:0', cluster=cluster)):
            exec(made_in, made)
            v = tf.get_variable('v', [1], initializer=tf.zeros_initializer())
            optimizer = tf.train.GradientDescentOptimizer(0.1)
            updates = tf.group(*[optimizer.minimize(
                tf.reduce_sum(v * v), global_step=made['global_step'])
                for _ in range(200)])
        with tf.Session(servers[1].target) as sess:
            sess.run(tf.global_variables_initializer())
            threads = [threading.Thread(target=lambda: [
                sess.run(updates) for _ in range(40)]) for _ in range(2)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            assert sess.run(made["global_step"]) == 2 * 40 * 200


@pytest.mark.slow
def test_steps_per_run_makes_the_same_steps(procs, free_ports, small_data):
    # 10 steps an epoch, 5 to a session.run: the epochs and the accuracy of
    # one step per run.
    outputs = train(procs, free_ports, 'async', small_data, '--epochs=6',
                    '--validation_size=100', '--learning_rate=0.5',
                    '--print_every_epochs=2', '--steps_per_run=5')
    assert run_accuracy(outputs, 'async') > 0.9
    for i, output in enumerate(outputs):
        assert i in final_accuracies(output), output
        assert [(int(e), int(local)) for _, e, _, local, _
                in EPOCH_LINE.findall(output)] == [(1, 20), (3, 40), (5, 60)]


@pytest.mark.slow
@pytest.mark.parametrize('script, expected', [('async', 0.7), ('sync', 0.6)])
def test_fashion_mnist_two_epochs(procs, free_ports, fashion_mnist, script,
                                  expected):
    # With the book's learning rate, 2 epochs of softmax regression get
    # Fashion-MNIST to about 0.65 async and 0.5 sync; a tuned rate is fairer.
    outputs = train(procs, free_ports, script, fashion_mnist, '--epochs=2',
                    '--learning_rate=0.1', '--print_every_epochs=1',
                    timeout=240)
    for i, output in enumerate(outputs):
        assert final_accuracies(output)[i] > expected, output


# A comment that starts with a label labels the block below it, up to the
# next blank line or the next label.
LABEL = re.compile(r'^\s*# (PS|ASYNC|SYNC): ')
# The book's steps, in its order (docs/book.md); its model, loss and
# accuracy first, as functions that the evaluator builds too.
BOOK_STEPS = [
    r'w = tf.get_variable\(', r'b = tf.get_variable\(',
    r'loss_op = tf.reduce_mean\(cross_entropy\)', r'correct_pred = ',
    r'accuracy_op = tf.reduce_mean', r'def main\(',
    r'tf.train.ClusterSpec\(', r"if task.job_name == 'ps':",
    r'tf.train.Server\(', r'is_chief = ', r'replica_device_setter\(',
    r'global_step = tf.train.get_or_create_global_step\(\)',
    r'x_p = tf.placeholder', r'y_p = tf.placeholder',
    r'loss_op, accuracy_op = loss_and_accuracy\(model\(x_p, partitioner\),',
    r'optimizer = tf.train.GradientDescentOptimizer',
    r'train_op = optimizer.minimize\(loss_op', r'sv = tf.train.Supervisor\(',
    r'lstep = 0', r'for epoch in ', r'feed_dict = \{x_p: x_batch',
    r'loss(, \w+)* = sess.run\(', r'lstep \+= ', r"print\('worker=%d,epoch=",
    r'accuracy = sess.run\(accuracy_op', r"print\('worker=%d, final accuracy"]
# TensorFlow's own calls, which a reader can look up, in the scripts.
TF_CALLS = ['tf.train.ClusterSpec(', 'tf.train.Server(',
            'tf.train.replica_device_setter(', 'tf.train.Supervisor(']


def labelled_lines(path):
    """The script's lines, and {line number: label} of each line that a
    label covers: the code below a label's comment, up to the next blank
    line or label."""
    with open(path) as f:
        lines = f.read().splitlines()
    labelled, label = {}, None
    for n, line in enumerate(lines, 1):
        found = LABEL.match(line)
        if found:
            label = found.group(1)
        elif not line.strip():
            label = None
        elif label and not line.lstrip().startswith('#'):
            labelled[n] = label
    return lines, labelled


def code_lines(lines, start=1):
    return [n for n, line in enumerate(lines, 1) if n >= start
            and line.strip() and not line.lstrip().startswith('#')]


@pytest.mark.parametrize('script', ['async', 'sync'])
def test_the_script_reads_as_the_books(script):
    path = os.path.join(REPO, 'mnist_dist_%s.py' % script)
    lines, _ = labelled_lines(path)
    code = '\n'.join(lines[n - 1].split('  #')[0] for n in code_lines(lines))
    for call in TF_CALLS + ['tf.train.SyncReplicasOptimizer('] * (
            script == 'sync'):
        assert call in code, call
    at = [re.search(step, code, re.M) for step in BOOK_STEPS]
    assert all(at), [s for s, m in zip(BOOK_STEPS, at) if not m]
    starts = [m.start() for m in at]
    assert starts == sorted(starts), [s for s, _ in sorted(
        zip(BOOK_STEPS, starts), key=lambda x: x[1])]


@pytest.mark.parametrize('script', ['async', 'sync'])
def test_labels_are_few_and_above_their_blocks(script):
    """As horovod's example: a short comment above a block; from main on,
    at most one label for five lines of code, and none at a line's end."""
    lines, _ = labelled_lines(os.path.join(REPO, 'mnist_dist_%s.py' % script))
    main = next(n for n, line in enumerate(lines, 1)
                if line.startswith('def main('))
    labels = [n for n in range(main, len(lines) + 1)
              if LABEL.match(lines[n - 1])]
    assert 5 * len(labels) <= len(code_lines(lines, main))
    assert not [line for line in lines if re.search(
        r'\S.*#.*\b(PS|ASYNC|SYNC|BOOK):', line)]


def test_the_scripts_differ_only_in_labelled_blocks():
    differing = []
    for script, other in (('async', 'sync'), ('sync', 'async')):
        lines, labelled = labelled_lines(
            os.path.join(REPO, 'mnist_dist_%s.py' % script))
        other_lines, _ = labelled_lines(
            os.path.join(REPO, 'mnist_dist_%s.py' % other))
        docstring_end = next(n for n, line in enumerate(lines[1:], 2)
                             if line.endswith('"""'))
        matcher = difflib.SequenceMatcher(None, lines, other_lines,
                                          autojunk=False)
        for tag, i1, i2, _, _ in matcher.get_opcodes():
            differing += [
                (script, n, lines[n - 1]) for n in range(i1 + 1, i2 + 1)
                if tag != 'equal' and n > docstring_end
                and n not in labelled
                and lines[n - 1].strip()[:1] not in ('', '#')]
    assert differing == []
