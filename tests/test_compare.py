"""launcher/compare.py: its table in-process, and as `launch_local.sh
straggler` runs it: one table and one chart of an async, a sync and a sync
run with a backup worker, the last worker slowed in each."""

import os
import re
import sys
from collections import Counter

import pytest

from conftest import (assert_clean_exit, final_accuracies, left_running,
                      staleness_of)
from launcher.compare import (TIMING, Worker, overall, read_placement,
                              read_workers, seconds_to, table)


def test_the_run_as_a_whole():
    workers = {0: Worker(0.75, 90, 10.0, 30.0, 100, 1.0, 0,
                         Counter({0: 50, 2: 50})),
               1: Worker(0.85, 100, 12.0, 20.0, 300, 2.0, 4,
                         Counter({1: 100, 3: 100}))}
    # Staleness weighs each worker's by its gradients: (100 + 600) / 400.
    assert overall(workers) == Worker(
        0.8, 100, 12.0, 50.0, 400, 1.75, 4,
        Counter({0: 50, 1: 100, 2: 50, 3: 100}))


def test_a_worker_log_read_back(tmp_path):
    (tmp_path / 'worker1.log').write_text(
        'worker=1, final accuracy = 0.8125\n'
        'worker=1, local_steps=30, global_step=80, train_seconds=2.5, '
        'steps_per_sec=12.0\n'
        'worker=1, gradients=30, applied=28, dropped=2, staleness mean=0.10 '
        '(0:28 1:1 2:1)\n')
    # A worker that did not finish is left out.
    (tmp_path / 'worker2.log').write_text('worker=2, starting at 0\n')
    assert read_workers(str(tmp_path)) == {1: Worker(
        0.8125, 80, 2.5, 12.0, 30, 0.1, 2, Counter({0: 28, 1: 1, 2: 1}))}


def test_where_the_model_lived_is_the_chiefs_placement(tmp_path):
    (tmp_path / 'worker0.log').write_text(
        '/job:worker/task:0: /job:ps/task:0 (h:1) holds b: 40 bytes, 0.1% '
        'of the model\n'
        'worker=0, starting at global_step=0\n'
        '/job:worker/task:0: /job:ps/task:1 (h:2) holds w: 31,360 bytes, '
        '99.9% of the model\n')
    assert read_placement(str(tmp_path)) == [
        '/job:ps/task:0 (h:1) holds b: 40 bytes, 0.1% of the model',
        '/job:ps/task:1 (h:2) holds w: 31,360 bytes, 99.9% of the model']


def test_logs_without_staleness_show_none():
    workers = {0: Worker(0.75, 90, 10.0, 30.0, 0, None, None, None)}
    lines = table({'async': workers}, {'async': {}}, 0.7).splitlines()
    assert lines[0] == ('| run | worker | accuracy | global steps | seconds '
                        '| steps/s | staleness | dropped | seconds to 0.7000 |')
    assert lines[2:] == [
        '| async | 0 | 0.7500 | 90 | 10.0 | 30.0 | - | - | - |',
        '| async | all | 0.7500 | 90 | 10.0 | 30.0 | - | - | - |']


def test_seconds_to_the_first_point_that_reaches_the_target():
    curve = [(10, 1.5, 0.5), (20, 3.0, 0.81), (30, 4.5, 0.79), (40, 6.0, 0.9)]
    assert seconds_to(curve, 0.8) == 3.0
    assert seconds_to(curve, 0.9) == 6.0
    assert seconds_to(curve, 0.95) is None


@pytest.mark.slow
@pytest.mark.xdist_group('real')  # real processes (pytest.ini)
def test_straggler_table_and_chart(procs, tmp_path, free_port_run,
                                   small_data):
    import matplotlib.image
    run_dir = tmp_path / 'run'
    launcher = procs.start(
        ['env', 'PYTHON=' + sys.executable, './launch_local.sh', '-H', '-b',
         str(free_port_run(4)), '-o', str(run_dir), 'straggler',
         '--data_dir=' + small_data, '--validation_size=100', '--epochs=6',
         '--print_every_epochs=2', '--learning_rate=0.5'], 'launcher')
    procs.wait_all([launcher], 600)
    output = assert_clean_exit(procs, launcher, 0)
    assert left_running(launcher) == []
    assert re.search(r'^sync: .*, worker 2 20 ms slower a step, logs in ',
                     output, re.M)
    # Each run's chief said how far it was, and how long it had left.
    assert len(re.findall(r'^worker=0, global_step=\d+, local_step=\d+, \d+ '
                          r'steps/s, epoch 6 of 6, (?:\d+ min )?\d+ s left$',
                          output, re.M)) == 3, output
    rows = re.findall(r'^\| (async|sync|backup) \| (\d|all) \| (.*) \|$',
                      output, re.M)
    assert [(run, w) for run, w, _ in rows] == [
        (run, w) for run in ('async', 'sync', 'backup')
        for w in ('0', '1', '2', 'all')]
    table = {(run, w): cells.split(' | ') for run, w, cells in rows}
    for cells in table.values():
        assert len(cells) == 7
        assert float(cells[0]) > 0.9  # accuracy
    for run in ('async', 'sync', 'backup'):
        # The table says what each worker's log says.
        for w in range(3):
            log = (run_dir / run / ('worker%d.log' % w)).read_text()
            cells = table[(run, str(w))]
            assert cells[0] == '%.4f' % final_accuracies(log)[w]
            assert cells[1] == TIMING.findall(log)[0][2]
            gradients, _, dropped, mean, _ = staleness_of(log)
            assert cells[4:6] == ['%.2f' % mean, '%d' % dropped]
        assert os.path.exists(run_dir / run / 'logdir' / 'checkpoint')
        # Each run reaches the lowest final accuracy, with its last
        # measurement at the latest.
        assert float(table[(run, 'all')][6]) > 0
    # Where each run's model lived: all of it on the one ps.
    for run in ('async', 'sync', 'backup'):
        assert re.findall(r'^%s: /job:ps/task:(\d) \(.*\) holds .*, w: '
                          r'[\d,]+ bytes, 100.0%% of the model$' % run,
                          output, re.M) == ['0']
    # Async drops no gradient; sync with a backup worker the most.
    assert int(table[('async', 'all')][5]) == 0
    assert int(table[('backup', 'all')][5]) > int(table[('sync', 'all')][5])
    image = matplotlib.image.imread(str(run_dir / 'comparison.png'))
    assert image.shape[0] > 300 and image.shape[1] > 300
