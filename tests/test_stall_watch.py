"""The stall watch (ps_cluster/stall_watch.py): a run that makes no step
ends every worker, naming why."""

import os
import signal
import time

import pytest

from conftest import (LONG_RUN, SCRIPTS, assert_clean_exit,
                      assert_one_error_line, ps_port)

pytestmark = pytest.mark.slow  # not in the fast tier


# A stalled run ends every worker, each naming why, side by side: a frozen
# ps (async, sync), which accepts connections and answers nothing (only a
# call with a deadline tells it from a live one; the line names the ps,
# never the worker itself, which a failed call's error may name); and a sync
# chief killed, without which no update is applied.
def test_a_stalled_run_ends_every_worker_naming_why(procs, free_ports,
                                                    small_data):
    frozen = {script: procs.cluster(script, free_ports,
                                    '--data_dir=' + small_data,
                                    '--stall_timeout=10', *LONG_RUN,
                                    name=script + '-frozen-')
              for script in SCRIPTS}
    ps, workers = procs.cluster('sync', free_ports, '--data_dir=' + small_data,
                                '--stall_timeout=5', *LONG_RUN,
                                name='no-chief-')
    for _, run_workers in list(frozen.values()) + [(ps, workers)]:
        procs.wait_for_epoch(run_workers)
    for frozen_ps, _ in frozen.values():
        os.kill(frozen_ps.pid, signal.SIGSTOP)
    stopped = time.time()
    os.kill(workers[0].pid, signal.SIGKILL)
    procs.wait_all(workers + [ps], 60)
    for worker in workers[1:]:
        assert_one_error_line(
            procs, worker, 1, 'training stalled: no new global step for 5 s',
            'missing: /job:worker/task:0 (localhost:')
    assert_clean_exit(procs, ps, 0)
    procs.wait_all([w for _, ws in frozen.values() for w in ws], 10 + 30,
                   since=stopped)
    for frozen_ps, frozen_workers in frozen.values():
        for i, worker in enumerate(frozen_workers):
            assert_one_error_line(
                procs, worker, 1,
                'training stalled: no new global step for 10 s',
                '/job:ps/task:0 (localhost:%d) does not answer'
                % ps_port(frozen_ps))
            assert 'lost the connection to /job:worker/task:%d ' % i \
                not in procs.output(worker)
        os.kill(frozen_ps.pid, signal.SIGCONT)
