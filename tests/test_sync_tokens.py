"""Sync's tokens (ps_cluster/sync_tokens.py): a sync worker started again
rejoins the run; a lost worker's token is put back in test_liveness.py."""

import os
import signal

import pytest

from conftest import LONG_RUN, assert_clean_exit, final_accuracies

pytestmark = pytest.mark.slow  # not in the fast tier


def test_sync_worker_started_again_rejoins(procs, free_ports, small_data):
    ports = free_ports(4)
    # Slow enough that the others still train when it is back.
    flags = ['--data_dir=' + small_data, '--step_delay_ms=20',
             '--epochs=60'] + LONG_RUN[1:]
    ps, workers = procs.cluster('sync', lambda n: ports, *flags)
    procs.wait_for_output(workers[2], r'^worker=2,epoch=1,', 60)
    os.kill(workers[2].pid, signal.SIGKILL)
    workers[2].wait()
    again = procs.script('sync', 'worker', 2, ports[:1], ports[1:], *flags)
    started = procs.wait_for_output(
        again, r'^worker=2, starting at global_step=(\d+)$', 60)
    assert int(started.group(1)) > 0
    procs.wait_all(workers[:2] + [again, ps], 120)
    for i, worker in enumerate(workers[:2] + [again]):
        assert i in final_accuracies(assert_clean_exit(procs, worker, 0))
    assert_clean_exit(procs, ps, 0)
