"""A ps's end of a run (ps_cluster/ps_task.py): a worker that never came
ends every task; a ps waits for silent workers in
test_recoverable_session.py."""

import time

import pytest

from conftest import LONG_RUN, assert_one_error_line

pytestmark = pytest.mark.slow  # not in the fast tier


# The ps gives up on a worker that never came, and tells the others: a run
# with fewer workers than asked for is a mistake of the cluster's, which
# async and sync answer alike.
def test_worker_that_never_came_ends_every_task(procs, free_ports,
                                                small_data):
    ports = free_ports(4)
    # 20 ms a step: the two workers' run outlasts the ps's wait for the third.
    flags = ['--data_dir=' + small_data, '--startup_timeout=10',
             '--step_delay_ms=20'] + LONG_RUN
    tasks = [procs.script('sync', 'ps', 0, ports[:1], ports[1:], *flags)] + [
        procs.script('sync', 'worker', i, ports[:1], ports[1:], *flags)
        for i in (0, 1)]
    started = time.time()
    procs.wait_all(tasks, 10 + 10 + 15)  # its imports, on 2 cores, too
    missing = '/job:worker/task:2 (localhost:%d) did not come up within 10 s' \
        % ports[3]
    assert_one_error_line(procs, tasks[0], 1, missing)
    for worker in tasks[1:]:
        assert_one_error_line(procs, worker, 1, 'which ended: "%s"' % missing)
    assert time.time() - started < 10 + 10 + 15
