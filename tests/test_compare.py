"""launcher/compare.py, as `launch_local.sh compare` runs it: one table and
one chart of an async and a sync run."""

import os
import re
import sys

import pytest

from conftest import assert_clean_exit, final_accuracies, left_running
from launcher.compare import TIMING

pytestmark = pytest.mark.slow  # not in the fast tier


def test_compare_table_and_chart(procs, tmp_path, free_port_run, small_data):
    import matplotlib.image
    run_dir = tmp_path / 'run'
    launcher = procs.start(
        ['env', 'PYTHON=' + sys.executable, './launch_local.sh', '-H', '-b',
         str(free_port_run(4)), '-o', str(run_dir), 'compare',
         '--data_dir=' + small_data, '--validation_size=100', '--epochs=6',
         '--print_every_epochs=2', '--learning_rate=0.5'], 'launcher')
    procs.wait_all([launcher], 240)
    output = assert_clean_exit(procs, launcher, 0)
    assert left_running(launcher) == []
    rows = re.findall(r'^\| (\d|all) \| (.*) \|$', output, re.M)
    assert [name for name, _ in rows] == ['0', '1', '2', 'all']
    table = {name: cells.split(' | ') for name, cells in rows}
    for cells in table.values():
        assert len(cells) == 8
        assert float(cells[0]) > 0.9 and float(cells[4]) > 0.9  # accuracy
    # A sync worker that starts late may find the run done: 0 steps/s.
    assert float(table['all'][3]) > 0 and float(table['all'][7]) > 0
    # The table says what each worker's log says.
    for column, mode in ((0, 'async'), (4, 'sync')):
        for w in range(3):
            log = (run_dir / mode / ('worker%d.log' % w)).read_text()
            assert table[str(w)][column] == '%.4f' % final_accuracies(log)[w]
            assert table[str(w)][column + 1] == TIMING.findall(log)[0][2]
        assert os.path.exists(run_dir / mode / 'logdir' / 'checkpoint')
    image = matplotlib.image.imread(str(run_dir / 'comparison.png'))
    assert image.shape[0] > 300 and image.shape[1] > 300
