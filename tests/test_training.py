"""The real scripts, one process per task: 1 ps + 3 workers on localhost."""

import re

import pytest

from conftest import final_accuracies, left_running

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
        assert accuracy[i] > 0.9, output
        epochs = [(int(e), int(local)) for w, e, _, local, _
                  in EPOCH_LINE.findall(output)]
        assert all(w == str(i) for w, *_ in EPOCH_LINE.findall(output))
        if script == 'async':  # every worker walks every epoch itself
            assert epochs == [(1, 20), (3, 40), (5, 60)]
        else:  # it stops when the shared global step reaches 6 epochs
            assert epochs == [(e, 10 * (e + 1)) for e, _ in epochs]
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
    for i, output in enumerate(outputs):
        assert final_accuracies(output)[i] > 0.9, output
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
