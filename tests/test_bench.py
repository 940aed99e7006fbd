"""bench/bench.py runs end to end and reports every figure it promises. Its
speed figures are for people to read; no test holds them to a number."""

import json
import re
import subprocess
import sys

import pytest

from conftest import REPO, START_UP

# Not in the fast tier; real processes, in turn with the others (pytest.ini).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group('real')]


def test_bench_reports_every_figure(small_data, tmp_path):
    out = tmp_path / 'bench.json'
    result = subprocess.run(
        [sys.executable, '-m', 'bench.bench', '--data_dir=' + small_data,
         '--validation_size=100', '--epochs=3', '--learning_rate=0.5',
         '--workers=1', '--repeats=1', '--baseline_steps=200',
         '--target_accuracy=0.5', '--tf2_steps_per_function=5',
         '--async_steps_per_run=5', '--ps_tasks=2',
         '--json=' + str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    figures = json.loads(out.read_text())
    assert figures['baseline']['steps_per_sec'] > 0
    assert all(s > 0 for s in figures['import_seconds'].values())
    assert sorted(figures['clusters']) == sorted([
        'async, 1 workers', 'sync, 1 workers', 'async, 1 workers, 5 steps/run',
        'async, 1 workers, 2 ps', 'async, 1 workers, 2 ps, w split',
        'async, 2 workers, 1 straggler', 'sync, 2 workers, 1 straggler',
        'sync, 2 workers, 1 straggler, 1 backup'])
    for run in figures['clusters'].values():
        assert run['steps_per_sec'] > 0
        assert run['seconds_to_all_training'] > 0
        assert run['seconds_last_step_to_all_gone'] >= 0
        assert run['accuracy'] > 0.5
    assert sorted(figures['tf2']) == [
        'TF 2.x PS strategy, 1 workers, 5 steps/function']
    for run in figures['tf2'].values():
        assert run['steps_per_sec'] > 0
        assert run['accuracy'] > 0.5
    assert figures['floor']['reads_per_sec_scalar'] > 0
    assert figures['floor']['reads_per_sec_w'] > 0
    # The classes of the small data are learned within the first epochs.
    tf2_best = max(figures['tf2'],
                   key=lambda name: figures['tf2'][name]['steps_per_sec'])
    assert sorted(figures['seconds_to_target']) == sorted([
        'one process', 'async, 1 workers', 'sync, 1 workers',
        'async, 1 workers, 5 steps/run', tf2_best])
    assert all(s > 0 for s in figures['seconds_to_target'].values())
    assert '| async, 1 workers |' in result.stdout
    assert '| TF 2.x PS strategy, 1 workers, 5 steps/function |' in (
        result.stdout)
    assert 'Round-trip floor' in result.stdout
    # A progress line for each run as it starts.
    assert re.search(r'^bench: \d+:\d\d async, 1 workers, run 1 of 1$',
                     result.stderr, re.M), result.stderr


def test_bench_measures_several_ps_tasks_only():
    result = subprocess.run(
        [sys.executable, '-m', 'bench.bench', '--ps_tasks=2,1'],
        cwd=REPO, capture_output=True, text=True, timeout=START_UP)
    assert result.returncode == 1
    assert (": each must be 2 or more: the async rows are on 1 ps"
            in result.stderr)


def test_bench_scale_reports_every_figure(small_data, tmp_path):
    if subprocess.run(['unshare', '--user', '--map-root-user', '--net',
                       'true']).returncode:
        pytest.skip('no private network namespace here (unshare failed)')
    out = tmp_path / 'bench_scale.json'
    result = subprocess.run(
        [sys.executable, '-m', 'bench.bench_scale', '--data_dir=' + small_data,
         '--validation_size=100', '--workers=3', '--seconds=2',
         '--json=' + str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    figures = json.loads(out.read_text())
    assert sorted(figures) == ['3']
    for run in figures.values():
        assert run['new_tcp_connections_per_sec'] >= 0
        assert run['heartbeats_per_worker_per_sec'] > 0
    assert '| 3 |' in result.stdout
