"""How a task ends (ps_cluster/exits.py): in-process, the logic of what
can be tested without ending the process (the failure a task raises, a
usage error, the last words told the cluster); and the cluster test of what
only a cluster shows: Ctrl-C on a ps ends every worker quoting its reason
(on a worker, in test_liveness.py)."""

import os
import signal
import threading
import time

import pytest

from conftest import (LONG_RUN, SCRIPTS, START_UP, assert_interrupted,
                      assert_one_error_line, ps_port)
from ps_cluster import exits


def name():
    return '/job:ps/task:0'


def test_a_task_failed_carries_its_message_and_status():
    failed = exits.TaskFailed(ValueError('no data in /x'), 2)
    assert (str(failed), failed.message, failed.status) == (
        'no data in /x', 'no data in /x', 2)
    assert exits.TaskFailed('lost the ps').status == 1


def test_a_usage_error_is_one_line_and_status_2(monkeypatch, capsys):
    monkeypatch.setattr('sys.argv', ['/work/mnist_dist_async.py'])
    with pytest.raises(SystemExit) as end:
        exits.usage_error('--job_name is required')
    assert end.value.code == 2
    assert capsys.readouterr() == (
        '', 'mnist_dist_async.py: error: --job_name is required\n')


def test_the_last_words_are_told_the_last_way_given():
    first, last = [], []
    end = exits.TaskEnd(name)
    end.before_leaving(first.append)
    end.before_leaving(last.append)
    end._say_last_words('interrupted')
    assert (first, last) == ([], ['interrupted'])


def test_no_way_to_tell_says_nothing(capsys):
    exits.TaskEnd(name)._say_last_words('interrupted')
    assert capsys.readouterr() == ('', '')


def test_a_tell_that_blocks_is_given_up_on(monkeypatch):
    monkeypatch.setattr(exits.TaskEnd, 'LAST_WORDS_SECS', 0.1)
    frozen = threading.Event()  # a frozen ps, thawed when the test is done
    end = exits.TaskEnd(name)
    end.before_leaving(lambda reason: frozen.wait())
    started = time.monotonic()
    end._say_last_words('interrupted')
    assert time.monotonic() - started < 2
    frozen.set()


def test_a_tell_that_fails_is_said_in_one_line(capsys):
    def tell(reason):
        raise ConnectionError('the ps is gone')
    end = exits.TaskEnd(name)
    end.before_leaving(tell)
    end._say_last_words('interrupted')
    # One line naming the task, never a traceback.
    assert capsys.readouterr() == (
        '', '/job:ps/task:0: cannot tell the other tasks why: the ps is '
            'gone\n')


@pytest.mark.slow  # not in the fast tier
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
        procs.wait_all([ps] + workers, START_UP, since=sent)
        assert_interrupted(procs, ps, 130, '/job:ps/task:0')
        for i, worker in enumerate(workers):
            assert_one_error_line(
                procs, worker, 1, 'lost the connection to /job:ps/task:0 '
                '(localhost:%d), which ended: "interrupted"' % ps_port(ps))
