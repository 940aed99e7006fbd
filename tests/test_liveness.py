"""Many workers, watched over by liveness.py.

Liveness rides on the ps tasks' channels, so the cost per worker does not
grow with their number (bench_scale.py measures it); here the runs of 16
workers and 1 or 2 ps tasks complete, every worker with its final accuracy
(above 0.9, as 3 workers reach), and every ps leaves. A ps that goes away is
in test_training_session.py, the other faults in test_failures.py.
"""

import pytest

from conftest import final_accuracies, left_running

pytestmark = pytest.mark.slow  # not in the fast tier


@pytest.mark.parametrize('script', ['async', 'sync'])
@pytest.mark.parametrize('num_ps', [1, 2])
def test_sixteen_workers_complete(procs, free_ports, small_data, script,
                                  num_ps):
    # Small steps, a few epochs: 17 or 18 processes take turns on 2 cores.
    ps, workers = procs.cluster(script, free_ports, '--data_dir=' + small_data,
                                '--epochs=3', '--validation_size=100',
                                '--learning_rate=0.5', num_workers=16,
                                num_ps=num_ps)
    ps = ps if num_ps > 1 else [ps]
    procs.wait_all(workers + ps, 420)
    for i, worker in enumerate(workers):
        output = procs.output(worker)
        assert worker.returncode == 0, output
        assert 'Traceback' not in output
        # The classes are separable: with 2 ps tasks, w and b apart, too.
        assert final_accuracies(output)[i] > 0.9, output
    for proc in workers + ps:
        assert proc.returncode == 0, procs.output(proc)
        assert left_running(proc) == []
