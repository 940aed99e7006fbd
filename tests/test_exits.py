"""How a task ends (ps_cluster/exits.py): Ctrl-C on a ps ends every worker
quoting its reason; on a worker, in test_liveness.py."""

import os
import signal
import time

import pytest

from conftest import (LONG_RUN, SCRIPTS, assert_interrupted,
                      assert_one_error_line, ps_port)

pytestmark = pytest.mark.slow  # not in the fast tier


def test_ctrl_c_on_the_ps_ends_every_worker_with_its_reason(
        procs, free_ports, small_data):
    # Both scripts side by side; the sync one would wait --ps_timeout (5 s)
    # for a ps that said nothing.
    runs = {script: procs.cluster(script, free_ports,
                                  '--data_dir=' + small_data,
                                  '--ps_timeout=5', *LONG_RUN, name=script)
            for script in SCRIPTS}
    for ps, workers in runs.values():
        procs.wait_for_epoch(workers)
    for ps, _ in runs.values():
        os.killpg(ps.pid, signal.SIGINT)
    sent = time.time()
    for ps, workers in runs.values():
        procs.wait_all([ps] + workers, 10, since=sent)
        assert_interrupted(procs, ps, 130, '/job:ps/task:0')
        for i, worker in enumerate(workers):
            assert_one_error_line(
                procs, worker, 1, 'lost the connection to /job:ps/task:0 '
                '(localhost:%d), which ended: "interrupted"' % ps_port(ps))
