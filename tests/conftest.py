"""Fixtures: free ports, IDX data sets, an HTTP mirror, in-process servers,
and tasks run as processes.

How a test starts tasks:
- In-process (a module's logic that needs servers but no cluster of
  processes): shared_cluster(), this run's one set of servers, emptied for
  each test; cluster_of() and small_model.server() where a test needs a
  fresh ps or a task that is not up yet (small_model.py).
- A cluster of processes: procs.cluster() and procs.script() fork each task
  from a forkserver that imported TensorFlow once (bench/forked.py): its own
  process, pid, session, signals, ports, exit status and log.
- A real process, `python SCRIPT` (procs.start()): where the
  test is about the command line or start-up itself (--help, usage errors,
  launch_local.sh, whose runs are each script's plain cluster, Slurm,
  containers, TF 1.15), or measures a task's threads or memory.
"""

import contextlib
import functools
import glob
import gzip
import http.server
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid

import numpy as np
import pytest

from bench import forked
from launcher.compare import STALENESS, counts

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FASHION_MNIST = '/usr/share/datasets/fashion-mnist'
ACCURACY = re.compile(r'^worker=(\d+), final accuracy = ([0-9.]+)$', re.M)
FINAL_STEP = re.compile(r'^worker=\d+, local_steps=(\d+), global_step=(\d+),',
                        re.M)
EVALUATED = re.compile(r'^evaluator: global_step=(\d+), loss=\S+, '
                       r'accuracy=(\S+) \(\S+\)$', re.M)
# TensorFlow's own C++ log lines, which TF_CPP_MIN_LOG_LEVEL cannot silence
# before its logging is initialized: absl's format (2.21) and TensorFlow's
# older one (2.16).
TF_LOG_LINE = re.compile(r'^([IWEF]\d{4} |WARNING: All log messages before|'
                         r'\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IWEF] )')


@functools.lru_cache(maxsize=None)
def script_help(script):
    """What `python mnist_dist_{script}.py --help` prints, and its exit
    status: run once a session, as a user runs it."""
    ran = subprocess.run([sys.executable, 'mnist_dist_%s.py' % script,
                          '--help'], cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    return ran.stdout, ran.stderr, ran.returncode


def own_lines(stderr):
    """The lines of stderr that our code printed, not TensorFlow's logging."""
    return [line for line in stderr.splitlines()
            if line and not TF_LOG_LINE.match(line)]


def final_accuracies(output):
    return {int(w): float(a) for w, a in ACCURACY.findall(output)}


def staleness_of(output):
    """(gradients, applied, dropped, mean, {staleness: session.runs}) of a
    worker's closing line."""
    (_, gradients, applied, dropped, mean, runs), = STALENESS.findall(output)
    return (int(gradients), int(applied), int(dropped), float(mean),
            counts(runs))


def run_accuracy(outputs, script):
    """The final accuracy of the model a run leaves, from its workers'
    outputs: the lowest of the sync workers', which measure the same model;
    in async, that of the worker that made the run's last step, since one
    that ends earlier may measure the model as the others' stale gradients
    land."""
    accuracies = [a for output in outputs
                  for a in final_accuracies(output).values()]
    if script == 'sync':
        return min(accuracies)
    last_steps = [int(step) for output in outputs
                  for _, step in FINAL_STEP.findall(output)]
    assert len(last_steps) == len(accuracies)
    return accuracies[last_steps.index(max(last_steps))]


def evaluations(output):
    """The evaluator's lines: (global step, accuracy), one per checkpoint."""
    return [(int(s), float(a)) for s, a in EVALUATED.findall(output)]


# Every port handed out in this run: clusters that run side by side, each
# given its ports by a call of its own, never share one.
_given = set()


def _free_ports(n):
    # Held open together, the sockets get n distinct ports.
    with contextlib.ExitStack() as stack:
        ports = []
        while len(ports) < n:
            s = stack.enter_context(socket.socket())
            s.bind(('localhost', 0))
            if s.getsockname()[1] not in _given:
                ports.append(s.getsockname()[1])
        _given.update(ports)
        return ports


@pytest.fixture
def free_ports():
    """free_ports(n): n distinct ports that nothing listens on right now."""
    return _free_ports


@pytest.fixture
def shared_cluster(free_ports):
    """shared_cluster(num_ps=1, num_workers=2): a ClusterSpec of this run's
    shared in-process servers, their containers emptied (small_model.py)."""
    import small_model  # TensorFlow: for the in-process tests alone
    return lambda num_ps=1, num_workers=2: small_model.shared_cluster(
        free_ports, num_ps, num_workers)


@pytest.fixture
def free_port_run(free_ports):
    """free_port_run(n): the first of n consecutive free ports."""
    def take(n):
        for _ in range(100):
            base = free_ports(1)[0]
            if base + n < 65536 and all(
                    not listening(port) and _bindable(port)
                    for port in range(base, base + n)):
                return base
        pytest.fail('no %d consecutive free ports' % n)
    return take


def _bindable(port):
    with socket.socket() as s:
        try:
            s.bind(('localhost', port))
            return True
        except OSError:
            return False


def write_idx(path, array):
    header = bytes([0, 0, 0x08, array.ndim]) + np.array(
        array.shape, '>u4').tobytes()
    with gzip.open(path, 'wb') as f:
        f.write(header + array.astype(np.uint8).tobytes())


def write_dataset(directory, num_train, num_test, seed=0):
    """IDX files of 28x28 images whose classes are easy to learn: each class
    lights its own random set of pixels, on top of noise."""
    rng = np.random.default_rng(seed)
    prototypes = rng.random((10, 28, 28)) < 0.15
    for prefix, n in (('train', num_train), ('t10k', num_test)):
        labels = rng.integers(0, 10, n)
        images = rng.integers(0, 100, (n, 28, 28))
        images[prototypes[labels]] += 150
        write_idx(os.path.join(directory, prefix + '-images-idx3-ubyte.gz'),
                  images)
        write_idx(os.path.join(directory, prefix + '-labels-idx1-ubyte.gz'),
                  labels)
    return str(directory)


@pytest.fixture(scope='session')
def small_data(tmp_path_factory):
    """1,100 training images (100 held out for validation), 500 test."""
    return write_dataset(tmp_path_factory.mktemp('small_data'), 1100, 500)


@pytest.fixture
def http_server(tmp_path):
    """Serves tmp_path/'served' over HTTP on the host's loopback: yields the
    folder, its URL, and the list of paths requested so far."""
    served = tmp_path / 'served'
    served.mkdir()
    requested = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(served), **kwargs)

        def do_GET(self):
            requested.append(self.path)
            super().do_GET()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield served, 'http://127.0.0.1:%d/' % server.server_port, requested
    server.shutdown()


@pytest.fixture(scope='session')
def fashion_mnist():
    if not os.path.exists(os.path.join(FASHION_MNIST,
                                       'train-images-idx3-ubyte.gz')):
        pytest.skip('Fashion-MNIST is not installed in %s (Debian package '
                    'dataset-fashion-mnist)' % FASHION_MNIST)
    return FASHION_MNIST


@contextlib.contextmanager
def small_disks(folders, size):
    """Each of folders (made here) a tmpfs of `size` ('64k') while the
    block runs, a disk that fills up; the test skips where none can be
    mounted (root only)."""
    mounted = []
    try:
        for folder in folders:
            folder.mkdir()
            if os.geteuid() or subprocess.run(
                    ['mount', '-t', 'tmpfs', '-o', 'size=' + size, 'tmpfs',
                     str(folder)]).returncode:
                pytest.skip('cannot mount a small tmpfs here (root only)')
            mounted.append(folder)
        yield folders
    finally:
        for folder in mounted:
            subprocess.run(['umount', '-l', str(folder)])


def _output_file(path):
    """An empty file for a task's output, opened to append: the task shares
    its offset, which the test's reads move, and writes at the end all the
    same."""
    output = open(path, 'a+')
    output.truncate(0)
    return output


@pytest.fixture(scope='session', autouse=True)
def forkserver():
    """The forkserver of the tasks that share TensorFlow's import, started
    at once: it imports while the first tests run."""
    forked.warm_up()


def pytest_configure():
    # A suite run in the background (nohup, some CI runners) has SIGINT
    # ignored, which every task it starts would inherit, and bash cannot
    # trap a signal ignored when it started. Caught here, it is the default
    # again in every program this process starts. Not a preexec_fn: that
    # forks this process, whole, for each start, and its in-process tests
    # leave it thousands of threads (0.5 s a start with 120 servers, against
    # 1 ms without).
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


# Seconds a wait allows for start-up: a task started as a new interpreter
# (procs.start) pays TensorFlow's import, 6 to 8 CPU-s with TF 2.21, and a
# test may start several at once on 2 cores beside the other test process.
START_UP = 180


class Processes:
    """Processes started for one test, each in its own session so that the
    test can stop it and whatever it started; all are killed at teardown."""

    def __init__(self, log_dir):
        self.log_dir = log_dir
        self.running = []

    def start(self, args, name, env=None):
        log = _output_file(os.path.join(self.log_dir, name + '.log'))
        err = _output_file(os.path.join(self.log_dir, name + '.err'))
        env = dict(os.environ, PYTHONUNBUFFERED='1', **(env or {}))
        # The scripts' own default, whatever a test module set for itself.
        env.pop('TF_CPP_MIN_LOG_LEVEL', None)
        proc = subprocess.Popen(args, cwd=REPO, stdout=log, stderr=err,
                                env=env, start_new_session=True)
        proc.log, proc.err, proc.name = log, err, name
        self.running.append(proc)
        return proc

    def forked(self, script, args, name, env=None, netns=None):
        """Starts `python script args` from the forkserver, which imported
        TensorFlow once (bench/forked.py), with the environment variables
        env added, in the network namespace netns, if any."""
        log = _output_file(os.path.join(self.log_dir, name + '.log'))
        err = _output_file(os.path.join(self.log_dir, name + '.err'))
        proc = forked.Task(script, args, dict(os.environ, **(env or {})),
                           log.name, err.name, netns)
        proc.log, proc.err, proc.name = log, err, name
        self.running.append(proc)
        return proc

    def script(self, script, job, index, ps, workers, *flags, name=''):
        """Starts one task of mnist_dist_{script}.py, from the forkserver;
        its output files are named after the task, behind `name` (to tell
        clusters apart)."""
        args = ['--job_name=%s' % job, '--task_index=%d' % index,
                '--ps=%s' % ','.join('localhost:%d' % p for p in ps),
                '--worker=%s' % ','.join('localhost:%d' % p for p in workers)
                ] + list(flags)
        return self.forked('mnist_dist_%s.py' % script, args,
                           '%s%s%d' % (name, job, index))

    def cluster(self, script, free_ports, *flags, num_workers=3, num_ps=1,
                name=''):
        """num_ps ps + num_workers workers; returns (ps, workers), or
        (list of ps, workers) with more than one ps. Several clusters run
        side by side where each has its own name."""
        ports = free_ports(num_ps + num_workers)
        ps_ports, worker_ports = ports[:num_ps], ports[num_ps:]
        ps = [self.script(script, 'ps', i, ps_ports, worker_ports, *flags,
                          name=name) for i in range(num_ps)]
        workers = [self.script(script, 'worker', i, ps_ports, worker_ports,
                               *flags, name=name) for i in range(num_workers)]
        return (ps[0] if num_ps == 1 else ps), workers

    @staticmethod
    def output(proc):
        """What proc printed: its stdout, then its stderr."""
        return Processes.stdout(proc) + Processes.stderr(proc)

    @staticmethod
    def stdout(proc):
        proc.log.seek(0)
        return proc.log.read()

    @staticmethod
    def stderr(proc):
        proc.err.seek(0)
        return proc.err.read()

    def wait_for_output(self, proc, pattern, timeout, count=1, since=None):
        """Waits until proc's output matches pattern `count` times, within
        timeout seconds of `since` (a time.time(); now by default); returns
        the last match."""
        deadline = (since or time.time()) + timeout
        while time.time() < deadline:
            matches = list(re.finditer(pattern, self.output(proc), re.M))
            if len(matches) >= count:
                return matches[count - 1]
            if proc.poll() is not None:
                break
            time.sleep(0.2)
        pytest.fail('%s never printed %r:\n%s' % (
            proc.name, pattern, self.output(proc)[-3000:]))

    def wait_for_epoch(self, workers, epoch=None, timeout=START_UP):
        """Waits until each of workers (0, 1, ...) has printed its line of
        epoch `epoch`, or of any epoch."""
        for i, worker in enumerate(workers):
            self.wait_for_output(worker, r'^worker=%d,epoch=%s' % (
                i, '' if epoch is None else '%d,' % epoch), timeout)

    def wait_all(self, procs, timeout, since=None):
        """Waits for every proc, within timeout seconds of `since` (a
        time.time(); now by default); a hang fails the test, naming the
        laggards."""
        deadline = (since or time.time()) + timeout
        for proc in procs:
            try:
                proc.wait(max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                stuck = [p.name for p in procs if p.poll() is None]
                pytest.fail('still running after %d s: %s\n%s' % (
                    timeout, ', '.join(stuck), self.output(proc)[-3000:]))

    def kill_all(self):
        for proc in self.running:
            # A task that has ended and been waited for may have lent its
            # pid to another process.
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:  # a fork not yet in its session
                    proc.kill()
            proc.wait(30)
            proc.log.close()
            proc.err.close()


def _stat_fields(stat_path):
    with open(stat_path) as f:
        return f.read().rsplit(')', 1)[1].split()


def left_running(proc):
    """The live processes of proc's session (the launcher's children too):
    a zombie too while a thread of it still runs, since that thread may
    still hold its sockets."""
    alive = []
    for pid in filter(str.isdigit, os.listdir('/proc')):
        try:
            if int(_stat_fields('/proc/%s/stat' % pid)[3]) != proc.pid:
                continue
        except OSError:  # it has ended
            continue
        for path in glob.glob('/proc/%s/task/*/stat' % pid):
            try:
                if _stat_fields(path)[0] != 'Z':
                    alive.append(int(pid))
                    break
            except OSError:  # that thread has ended
                pass
    return alive


def listeners(ports):
    """What `ss` says holds each of ports that still listens: the message
    of an assertion that none does."""
    ports = [str(port) for port in ports if listening(port)]
    if not ports:
        return []
    try:
        table = subprocess.run(['ss', '-ltnpH'], capture_output=True,
                               text=True).stdout.splitlines()
    except OSError:  # no iproute2: the ports alone
        return ports
    return [line for line in table
            if any(':%s ' % port in line for port in ports)] or ports


@pytest.fixture
def procs(tmp_path):
    processes = Processes(str(tmp_path))
    yield processes
    processes.kill_all()


def listening(port):
    try:
        with socket.create_connection(('localhost', port), timeout=1):
            return True
    except OSError:
        return False


def _ip(*args, netns=None):
    prefix = ['ip', 'netns', 'exec', netns] if netns else []
    subprocess.run(prefix + ['ip'] + list(args), check=True,
                   capture_output=True)


@contextlib.contextmanager
def network_hosts(n, delay_ms=0):
    """n hosts, each a network namespace with its own address, joined by a
    bridge in a hub namespace that has an address of its own; their links
    delayed by delay_ms where the kernel has netem. Yields ((hub netns, hub
    address), [(netns, address)]). Root only: skips elsewhere."""
    if os.geteuid() != 0:
        pytest.skip('network namespaces need root')
    tag = uuid.uuid4().hex[:6]
    net = '10.213.%d.' % (int(tag[:2], 16) % 250)
    hub = 'pshub-' + tag
    if subprocess.run(['ip', 'netns', 'add', hub]).returncode:
        pytest.skip('cannot make network namespaces here')
    made = [hub]
    try:
        _ip('link', 'add', 'br0', 'type', 'bridge', netns=hub)
        _ip('addr', 'add', net + '254/24', 'dev', 'br0', netns=hub)
        _ip('link', 'set', 'br0', 'up', netns=hub)
        _ip('link', 'set', 'lo', 'up', netns=hub)
        machines = []
        for i in range(n):
            name, address = 'pshost%d-%s' % (i, tag), net + str(i + 1)
            inside, outside = 'h%d%s' % (i, tag), 'b%d%s' % (i, tag)
            subprocess.run(['ip', 'netns', 'add', name], check=True)
            made.append(name)
            _ip('link', 'add', inside, 'type', 'veth', 'peer', 'name',
                outside)
            _ip('link', 'set', inside, 'netns', name)
            _ip('link', 'set', outside, 'netns', hub)
            _ip('link', 'set', outside, 'master', 'br0', 'up', netns=hub)
            _ip('addr', 'add', address + '/24', 'dev', inside, netns=name)
            _ip('link', 'set', inside, 'up', netns=name)
            _ip('link', 'set', 'lo', 'up', netns=name)
            if delay_ms:
                # Optional: some kernels have no netem (sch_netem).
                subprocess.run(['ip', 'netns', 'exec', name, 'tc', 'qdisc',
                                'add', 'dev', inside, 'root', 'netem',
                                'delay', '%dms' % delay_ms],
                               capture_output=True)
            machines.append((name, address))
        yield (hub, net + '254'), machines
    finally:
        for name in made:
            subprocess.run(['ip', 'netns', 'del', name], capture_output=True)


# ------------------------------------------------- shared by the cluster tests

# Long enough to be killed mid-run, however long the clusters beside it take
# to start: 10 steps an epoch on the small data. 30 ms a step leaves the
# cores to the processes that start beside a run, not to its training: a
# run that waits to be killed trains all the while. A ps waits 5 s for the
# workers killed here, not --worker_timeout's 120.
LONG_RUN = ['--epochs=30000', '--print_every_epochs=1',
            '--validation_size=100', '--step_delay_ms=30',
            '--worker_timeout=5']
SHORT_RUN = ['--epochs=2', '--validation_size=100']
# Where a test waits for a fault to take its course, the two scripts' clusters
# run side by side: the waits overlap.
SCRIPTS = ('async', 'sync')


def ps_port(ps):
    flag, = [arg for arg in ps.args if arg.startswith('--ps=')]
    return int(flag.rsplit(':', 1)[1])


def assert_clean_exit(procs, proc, status):
    output = procs.output(proc)
    assert proc.returncode == status, output
    assert 'Traceback' not in output
    assert left_running(proc) == []
    return output


def assert_one_error_line(procs, proc, status, *words):
    """Exit status, one line of our own on stderr naming the problem, no
    traceback, nothing left running."""
    output = assert_clean_exit(procs, proc, status)
    lines = own_lines(procs.stderr(proc))
    assert len(lines) == 1, output
    assert ': error: ' in lines[0]
    for word in words:
        assert word in lines[0]
    return lines[0]


def assert_interrupted(procs, proc, status, task):
    output = assert_clean_exit(procs, proc, status)
    assert own_lines(procs.stderr(proc)) == [task + ': interrupted'], output

