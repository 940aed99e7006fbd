"""launch_local.sh: runs the cluster, reports, and leaves nothing behind."""

import hashlib
import os
import re
import signal
import subprocess
import sys

import pytest

import mnist_data
from conftest import (REPO, START_UP, final_accuracies, left_running,
                      listeners, listening, own_lines, write_dataset)

# Not in the fast tier; real processes, in turn with the others (pytest.ini).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group('real')]

# On a machine with a GPU, each worker's line names its GPU too.
SUMMARY = re.compile(r'^worker (\d+): exit (\d+), final accuracy = (\S+?)'
                     r'(?:, on GPU \d+ of \d+)?$', re.M)


def network_namespaces_work():
    return subprocess.run(['unshare', '--user', '--map-root-user', '--net',
                           'true'], capture_output=True).returncode == 0


def launch(procs, tmp_path, *args, env=None, nohup=False):
    env_python = ['env', 'PYTHON=' + sys.executable]
    return procs.start((['nohup'] if nohup else []) + env_python + [
        './launch_local.sh', '-o', str(tmp_path / 'run')] + list(args),
        'launcher', env=env)


@pytest.mark.parametrize('script', ['async', 'sync'])
def test_launcher_runs_the_cluster(procs, tmp_path, free_port_run,
                                   small_data, script):
    """An evaluator beside it (-e), on RUN_DIR/logdir, which exports. Sync
    on the host's network (-H); async where a namespace is made whose
    network cannot be configured (one made without mapping root, as Ubuntu
    23.10 on makes a user's): one line says so, and it runs on the host's
    network."""
    base = free_port_run(4)
    where = (['-H'] if script == 'sync' else [])
    launcher = launch(procs, tmp_path, *where, '-b', str(base), '-e', script,
                      '--data_dir=' + small_data, '--epochs=3',
                      '--validation_size=100', '--learning_rate=0.5',
                      '--export_dir=%s' % (tmp_path / 'export'),
                      env={'LAUNCH_LOCAL_UNSHARE': 'unshare --user --net'})
    procs.wait_all([launcher], START_UP)
    output = procs.output(launcher)
    assert launcher.returncode == 0, output
    if script == 'async' and network_namespaces_work():
        assert own_lines(procs.stderr(launcher))[0] == (
            './launch_local.sh: no private network here: bringing up its '
            'loopback (ip link set lo up) was refused, so the cluster\'s ports '
            '%d-%d are open to the network (-H chooses that without trying; '
            'Ubuntu allows the namespace with sysctl '
            'kernel.apparmor_restrict_unprivileged_userns=0)'
            % (base, base + 3)), output
        assert 'iproute2' not in output
    summary = SUMMARY.findall(output)
    assert [(w, status) for w, status, _ in summary] == [
        ('0', '0'), ('1', '0'), ('2', '0')]
    assert all(float(accuracy) > 0.8 for _, _, accuracy in summary), output
    assert sorted(os.listdir(tmp_path / 'run')) == sorted(
        ['ps0.log', 'worker0.log', 'worker1.log', 'worker2.log',
         'evaluator0.log', 'logdir'])
    # It measured the last step: 3 epochs of 10 steps, of every worker in
    # async; one SavedModel of it.
    last = 90 if script == 'async' else 30
    assert re.search(r'^evaluator: global_step=%d, ' % last, output, re.M)
    assert os.listdir(tmp_path / 'export') == [str(last)]
    # The training lines were shown as they came, the chatter was not;
    # the chief's said how far the run was, each epoch from its second run
    # (its pace) on: in async, the others may have trained past its first
    # epoch by then.
    assert set(final_accuracies(output)) == {0, 1, 2}
    epochs = [int(epoch) for epoch in re.findall(
        r'^worker=0, global_step=\d+, local_step=\d+, \d+ steps/s, epoch '
        r'(\d) of 3, (?:\d+ min )?\d+ s left$', output, re.M)]
    assert epochs == ([1, 2, 3] if script == 'sync'
                      else list(range(epochs[0], 4))), output
    assert 'oneDNN' not in output
    assert left_running(launcher) == []
    assert listeners(range(base, base + 4)) == []


# What a task of launch_local.sh holds, at most, as docs/benchmark.md
# says: its measured figures (44 threads, 595 and 712 MB) and room for
# another environment's libraries; a task sized as before this bound held
# over 100 threads.
MOST_THREADS = 60
MOST_RSS_MB = 800


def task_pids(launcher):
    """{(job, index): pid} of the tasks the launcher started."""
    pids = {}
    for pid in left_running(launcher):
        try:
            with open('/proc/%d/cmdline' % pid, 'rb') as f:
                argv = f.read().decode().split('\0')
        except OSError:  # it has ended
            continue
        flags = dict(arg[2:].split('=', 1) for arg in argv
                     if arg.startswith('--') and '=' in arg)
        if any(arg.startswith(REPO) and arg.endswith('.py')
               for arg in argv) and 'job_name' in flags:
            pids[flags['job_name'], int(flags['task_index'])] = pid
    return pids


def status_of(pid):
    with open('/proc/%d/status' % pid) as f:
        return dict(line.split(':', 1) for line in f)


@pytest.mark.parametrize('script', ['async', 'sync'])
def test_a_killed_worker_is_named_and_nothing_waits_for_it(
        procs, tmp_path, free_port_run, small_data, script):
    """Worker 1 SIGKILLed mid-run, which lets it say nothing: the launcher
    tells the ps, which ends by itself once worker 0 has, naming it; the
    summary says why each task ended. Before it, each task's threads and
    memory, read from /proc as a user would, within the docs' figures."""
    base = free_port_run(3)
    launcher = launch(procs, tmp_path, '-H', '-n', '2', '-b', str(base),
                      script, '--data_dir=' + small_data, '--epochs=20',
                      '--print_every_epochs=1', '--validation_size=100',
                      '--step_delay_ms=30')
    # Struck at its first epoch of 20: 5 s of steps left at least.
    procs.wait_for_output(launcher, r'^worker=1,epoch=1,', START_UP)
    pids = task_pids(launcher)
    assert sorted(pids) == [('ps', 0), ('worker', 0), ('worker', 1)]
    for (job, _), pid in pids.items():
        status = status_of(pid)
        assert int(status['Threads']) <= MOST_THREADS, status
        assert int(status['VmRSS'].split()[0]) // 1024 <= MOST_RSS_MB, status
    os.kill(pids['worker', 1], signal.SIGKILL)
    procs.wait_all([launcher], START_UP)
    output = procs.output(launcher)
    assert launcher.returncode == 1, output
    summary = output[output.index('---- %s' % script):].splitlines()[1:]
    assert summary[:2] == [
        'ps 0: exit 0',
        '    /job:ps/task:0: every worker has ended; /job:worker/task:1 '
        '(localhost:%d) left: "killed by SIGKILL, as ./launch_local.sh '
        'saw"' % (base + 2)], output
    assert re.fullmatch(r'worker 0: exit 0, final accuracy = 0\.\d+',
                        summary[2]), output
    assert summary[3:] == ['worker 1: exit 137, final accuracy = none',
                           '    killed by SIGKILL'], output
    # The ps left by itself (its line above), not killed by the launcher.
    assert 'did not exit' not in output
    assert left_running(launcher) == []
    assert listeners(range(base, base + 3)) == []


def test_launcher_reports_failure(procs, tmp_path, free_port_run):
    base = free_port_run(3)
    launcher = launch(procs, tmp_path, '-H', '-b', str(base), '-n', '2',
                      'async', '--data_dir=' + str(tmp_path / 'nothing'),
                      '--startup_timeout=5')
    procs.wait_all([launcher], START_UP)
    output = procs.output(launcher)
    assert launcher.returncode == 1, output
    assert SUMMARY.findall(output) == [('0', '1', 'none'), ('1', '1', 'none')]
    assert 'worker0.log' in os.listdir(tmp_path / 'run')
    assert left_running(launcher) == []
    assert listeners(range(base, base + 3)) == []


def test_launcher_names_the_task_that_failed(procs, tmp_path, free_port_run,
                                             small_data):
    """A chief that fails at start: the others end at once, quoting it,
    not after --startup_timeout; the summary quotes each failed task."""
    base = free_port_run(4)
    a_file = tmp_path / 'a-file'
    a_file.write_text('')
    launcher = launch(procs, tmp_path, '-H', '-b', str(base), 'async',
                      '--data_dir=' + small_data, '--validation_size=100',
                      '--logdir=%s' % a_file)
    procs.wait_all([launcher], START_UP)
    output = procs.output(launcher)
    assert launcher.returncode == 1, output
    assert SUMMARY.findall(output) == [('0', '2', 'none'), ('1', '1', 'none'),
                                       ('2', '1', 'none')]
    why = '--logdir=%s: cannot write there' % a_file
    summary = output[output.index('---- async'):].splitlines()
    # The ps, which ended by itself, names the chief and quotes it.
    assert summary[1:3] == ['ps 0: exit 0', (
        '    /job:ps/task:0: every worker has ended; /job:worker/task:0 '
        '(localhost:%d) left (and 2 more: their own lines say why): "%s (%s '
        'is not a directory)"' % (base + 1, why, a_file))], output
    assert summary[4] == '    /job:worker/task:0: error: ' + why + (
        ' (%s is not a directory)' % a_file)
    for line in summary[6], summary[8]:
        assert line.startswith('    /job:worker/task:')
        assert 'the chief, /job:worker/task:0' in line and why in line
    assert 'did not' not in output
    assert left_running(launcher) == []


# compare runs each mode as a launcher of its own, which the signal must
# reach too, under nohup too: SIGHUP ignored from the start cannot be
# trapped. Each signal, each network and each mode at least once.
@pytest.mark.parametrize('host_network, mode, signum', [
    (True, 'async', signal.SIGINT), (False, 'async', signal.SIGTERM),
    (True, 'compare', signal.SIGINT)])
def test_ctrl_c_stops_every_task(procs, tmp_path, free_port_run, small_data,
                                 host_network, mode, signum):
    if not host_network and not network_namespaces_work():
        pytest.skip('unshare cannot make a network namespace here')
    base = free_port_run(3)
    launcher = launch(procs, tmp_path, *(['-H'] if host_network else []),
                      '-n', '2', '-b', str(base), mode,
                      '--data_dir=' + small_data, '--epochs=1000',
                      '--print_every_epochs=1', '--validation_size=100',
                      '--step_delay_ms=30', nohup=mode == 'compare')
    procs.wait_for_output(launcher, r'^worker=1,epoch=', START_UP)
    # In its own network namespace the cluster cannot be reached from here.
    assert listening(base) == host_network
    os.kill(launcher.pid, signum)
    procs.wait_all([launcher], 60)
    # Each task's log ends with its own line; bash says no 'Terminated'.
    # SIGTERM is a scheduler's preemption: the chief saves what it can (no
    # --logdir here), the ps waits for its word.
    interrupted = {(job, index): '/job:%s/task:%d: interrupted' % (job, index)
                   for job, index in [('ps', 0), ('worker', 0), ('worker', 1)]}
    status, says, ends = 130, 'interrupted, stopping every task', interrupted
    if signum == signal.SIGTERM:
        status, says = 143, 'terminated, stopping every task'
        ends = {**interrupted,
                ('ps', 0): '/job:ps/task:0: preempted; the chief has no '
                           '--logdir to save the model in',
                ('worker', 0): 'worker=0: preempted: has no --logdir to save '
                               'the model in'}
    assert launcher.returncode == status, procs.output(launcher)
    assert says in procs.output(launcher)
    logs = tmp_path / 'run' / ('async' if mode == 'compare' else '')
    for (job, index), end in ends.items():
        log = (logs / ('%s%d.log' % (job, index))).read_text()
        assert log.endswith(end + '\n'), log
    assert 'Terminated' not in procs.output(launcher)
    assert left_running(launcher) == []
    assert listeners(range(base, base + 3)) == []


def test_launcher_downloads_before_it_enters_its_namespace(
        procs, tmp_path, free_port_run, http_server):
    """The tasks' namespace reaches no other host: the launcher downloads
    the data for them, from the host's network, before any task starts."""
    if not network_namespaces_work():
        pytest.skip('unshare cannot make a network namespace here')
    served, url, requested = http_server
    write_dataset(served, num_train=1100, num_test=500)
    genuine = all(
        hashlib.sha256((served / name).read_bytes()).hexdigest() == sha256
        for name, sha256 in mnist_data.FILES.items())
    data_dir = tmp_path / 'data'
    base = free_port_run(4)
    launcher = launch(procs, tmp_path, '-b', str(base), 'async',
                      '--data_dir=' + str(data_dir), '--data_mirror=' + url,
                      '--epochs=1', '--validation_size=100')
    procs.wait_all([launcher], START_UP)
    output = procs.output(launcher)
    # The mirror on the host's loopback was asked: from inside the
    # namespace it could not have been.
    assert '/train-images-idx3-ubyte.gz' in requested
    assert 'Traceback' not in output
    assert left_running(launcher) == []
    if genuine:  # MNIST itself: downloaded once, then the run trains
        assert launcher.returncode == 0, output
        assert sorted(requested) == sorted('/' + n for n in mnist_data.FILES)
        assert set(final_accuracies(output)) == {0, 1, 2}
    else:  # other files: one line, before any task started
        assert launcher.returncode == 1, output
        lines = own_lines(procs.stderr(launcher))
        assert lines == ['mnist_data.py: error: train-images-idx3-ubyte.gz '
                         'not found in %s and not downloadable (%s'
                         'train-images-idx3-ubyte.gz has the wrong SHA-256); '
                         'put the four files %s there, or point --data_dir '
                         'at them' % (data_dir, url,
                                      ', '.join(mnist_data.FILES))], output
        assert not (tmp_path / 'run').exists()
        assert os.listdir(data_dir) == []


@pytest.mark.parametrize('args, message', [
    ([], 'usage:'),
    (['train'], 'usage:'),
    (['-n', '0', 'async'], "'0' is not a positive number"),
    (['-b', '65534', 'async'], 'ports 65534-65537 do not exist'),
    (['-t', 'async'], '-t adds a tf2 run to compare alone'),
    (['-n', '1', 'tf2'], 'tf2 needs 2 workers or more'),
    (['-n', '3', '-m', '4', 'async'], '-m starts some of the -n workers'),
    (['-m', '2', 'tf2'], '-m starts some of the -n workers of async or sync'),
])
def test_launcher_usage_errors(procs, tmp_path, args, message):
    launcher = launch(procs, tmp_path, *args)
    procs.wait_all([launcher], START_UP)
    assert launcher.returncode == 2
    assert message in procs.output(launcher)


@pytest.mark.parametrize('flag', ['-h', '--help'])
def test_launcher_help(procs, tmp_path, flag):
    launcher = launch(procs, tmp_path, flag)
    procs.wait_all([launcher], START_UP)
    output = procs.output(launcher)
    assert launcher.returncode == 0, output
    for words in ('usage:', 'compare', '-n NUM_WORKERS', '-H',
                  'Flags after the mode go to every task', 'exit status',
                  '130 if interrupted'):
        assert words in output
