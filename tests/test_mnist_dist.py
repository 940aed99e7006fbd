"""The two scripts: read as the book's, their markers and their diff; and
run, one process per task, 1 ps + 3 workers on localhost."""

import ast
import difflib
import os
import re

import pytest

from conftest import REPO, final_accuracies, left_running, run_accuracy

EPOCH_LINE = re.compile(r'^worker=(\d+),epoch=(\d+),global_step=(\d+), '
                        r'local_step=(\d+), loss=([0-9.e+-]+)$', re.M)


def train(procs, free_ports, script, data_dir, *flags, timeout=120):
    ps, workers = procs.cluster(script, free_ports, '--data_dir=' + data_dir,
                                *flags)
    procs.wait_all(workers + [ps], timeout)
    outputs = [procs.output(w) for w in workers]
    for proc in workers + [ps]:
        assert proc.returncode == 0, procs.output(proc)
        assert 'Traceback' not in procs.output(proc)
        assert left_running(proc) == []
    return outputs


@pytest.mark.parametrize('script', ['async', 'sync'])
def test_three_workers_learn_small_data(procs, free_ports, small_data, script):
    # 10 steps an epoch; the classes are separable, so accuracy must be high.
    outputs = train(procs, free_ports, script, small_data, '--epochs=6',
                    '--validation_size=100', '--learning_rate=0.5',
                    '--print_every_epochs=2')
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
    if script == 'async':
        # Global steps count every worker's updates: 3 x 60 in all. The
        # global step is fetched beside train_op, before or after its
        # increment and the other workers' last ones, so the last worker
        # may see 178 or 179.
        last = [int(EPOCH_LINE.findall(o)[-1][2]) for o in outputs]
        assert max(last) in (178, 179, 180)
    else:
        # One update per step of all the workers; all end on the same one,
        # with the same variables.
        assert len({final_accuracies(o)[i]
                    for i, o in enumerate(outputs)}) == 1


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


# A marker at the end of a statement's first line labels the statement.
MARKER = re.compile(r'#.*?\b(PS|ASYNC|SYNC|BOOK):')
# The book's steps, in its order, as they stand once every statement marked
# # BOOK: is gone (docs/book.md).
BOOK_STEPS = [
    r"if FLAGS.job_name == 'ps':", r'is_chief = ', r'replica_device_setter\(',
    r'global_step = tf.train.get_or_create_global_step\(\)',
    r'x_p = tf.placeholder', r'y_p = tf.placeholder',
    r'loss_op = tf.reduce_mean\(cross_entropy\)',
    r'optimizer = tf.train.GradientDescentOptimizer',
    r'train_op = optimizer.minimize\(loss_op',
    r'correct_pred = ', r'accuracy_op = ', r'sv = tf.train.Supervisor\(',
    r'lstep = 0', r'for epoch in ', r'feed_dict = \{x_p: x_batch',
    r'loss(, gstep)? = sess.run\(', r'lstep \+= ', r"print\('worker=%d,epoch=",
    r'accuracy = sess.run\(accuracy_op', r"print\('worker=%d, final accuracy"]


def labelled_lines(path):
    """{line number: markers} of every statement whose first line carries a
    marker: a compound statement with all it holds, but with # BOOK: its
    header alone (it stands for the book's header; the book's lines follow)."""
    with open(path) as f:
        source = f.read()
    lines = source.splitlines()
    labelled = {}
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.stmt):
            continue
        markers = set(MARKER.findall(lines[node.lineno - 1]))
        body = getattr(node, 'body', None)
        last = (body[0].lineno - 1 if 'BOOK' in markers
                and isinstance(body, list) else node.end_lineno)
        if markers:
            for n in range(node.lineno, last + 1):
                labelled.setdefault(n, set()).update(markers)
    return lines, labelled


@pytest.mark.parametrize('script', ['async', 'sync'])
def test_the_script_reads_as_the_books(script):
    lines, labelled = labelled_lines(
        os.path.join(REPO, 'mnist_dist_%s.py' % script))
    assert sum('# PS:' in line for line in lines) >= 5
    kept = '\n'.join(line.split('  #')[0] for n, line in enumerate(lines, 1)
                     if 'BOOK' not in labelled.get(n, ())
                     and not line.lstrip().startswith('#'))
    at = [re.search(step, kept, re.M) for step in BOOK_STEPS]
    assert all(at), [s for s, m in zip(BOOK_STEPS, at) if not m]
    starts = [m.start() for m in at]
    assert starts == sorted(starts), [s for s, _ in sorted(
        zip(BOOK_STEPS, starts), key=lambda x: x[1])]


def test_the_scripts_differ_only_in_marked_lines():
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
