"""Where a worker's model comes from (ps_cluster/session_start.py): a
checkpoint that cannot be restored ends every worker. Restoring and joining
the live model are in test_logdir.py and test_recoverable_session.py."""

import os

import pytest

from conftest import SHORT_RUN, assert_clean_exit, assert_one_error_line

pytestmark = pytest.mark.slow  # not in the fast tier


def test_unreadable_checkpoint_ends_every_worker(procs, free_ports,
                                                 small_data, tmp_path):
    logdir = tmp_path / 'logdir'
    logdir.mkdir()
    (logdir / 'checkpoint').write_text(
        'model_checkpoint_path: "model.ckpt-10"\n')
    for suffix in ('index', 'data-00000-of-00001', 'meta'):
        (logdir / ('model.ckpt-10.' + suffix)).write_bytes(os.urandom(512))
    ports = free_ports(4)
    flags = ('--data_dir=' + small_data, '--logdir=' + str(logdir),
             *SHORT_RUN)

    def task(job, index):
        return procs.script('async', job, index, ports[:1], ports[1:], *flags)
    ps, chief, worker1 = task('ps', 0), task('worker', 0), task('worker', 1)
    # Worker 1 may wait for the model when the chief leaves, or come after;
    # worker 2 comes after, and counts no departure of the chief's.
    procs.wait_all([chief], 60)
    workers = [chief, worker1, task('worker', 2)]
    procs.wait_all(workers + [ps], 30)
    assert_one_error_line(procs, workers[0], 1,
                          'cannot restore the checkpoint %s'
                          % (logdir / 'model.ckpt-10'),
                          'move it away, or choose another --logdir')
    for worker in workers[1:]:
        assert_one_error_line(procs, worker, 1, 'the chief',
                              'went away before the model was ready')
    assert_clean_exit(procs, ps, 0)
