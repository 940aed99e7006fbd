"""Tasks forked from one process that has imported TensorFlow once
(multiprocessing's forkserver), instead of a new interpreter each that
imports it again (about 7 CPU-s a task): for the benchmark's clusters, whose
start-up it measures apart (bench.import_seconds), and the tests' (tests/
conftest.py says which keep real processes).

Each task is still a process of its own: its pid, session, signals, ports
and gRPC server, its exit status and its output, running the script's own
code as `python SCRIPT ARGS` (or `python -m MODULE ARGS`) would; only the
import is shared, and so are its memory pages until written.
"""

import ctypes
import io
import multiprocessing
import os
import runpy
import signal
import subprocess
import sys
import threading

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What every task imports. Not cluster_utils, whose flags would clash with
# those of a task that defines its own (bench/tf2_ps_strategy.py).
PRELOAD = ['tensorflow.compat.v1', 'numpy', 'absl.app', 'grpc']

_forkserver = multiprocessing.get_context('forkserver')
_forkserver.set_forkserver_preload(PRELOAD)
# Tasks started from several threads take turns: each start swaps
# __main__'s spec and file out and back.
_starting = threading.Lock()


def warm_up():
    """Starts the forkserver, which imports PRELOAD meanwhile. TensorFlow
    reads its C++ log level and which Keras to import as it is imported:
    the scripts' own defaults, set before."""
    os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
    os.environ.setdefault('TF_USE_LEGACY_KERAS', '1')
    from multiprocessing import forkserver
    forkserver.ensure_running()


class Task:
    """`python SCRIPT ARGS`, or `python -m MODULE ARGS` for a target of
    '-m MODULE', forked, its output appended to the files stdout and
    stderr (one file may take both), with the environment env, in the
    network namespace netns (`ip netns add`'s name), if any; with what
    callers use of a subprocess.Popen: pid, args, poll(), wait(),
    returncode, kill()."""

    def __init__(self, target, args, env, stdout, stderr, netns=None):
        warm_up()
        self.args = [sys.executable] + target.split(' ', 1) + list(args)
        self._process = _forkserver.Process(
            target=_run, args=(target, list(args), env, stdout, stderr,
                               netns),
            # Daemonic: ended with the process that started it, which may
            # not outlive a task that serves until killed.
            name=target, daemon=True)
        # multiprocessing's child imports the parent's __main__ to find a
        # pickled function; _run is found in this module, and a __main__
        # that defines flags (bench.bench) would clash with the target's.
        with _starting:
            main = sys.modules['__main__']
            spec, path = main.__spec__, main.__dict__.pop('__file__', None)
            main.__spec__ = None
            try:
                self._process.start()
            finally:
                main.__spec__ = spec
                if path is not None:
                    main.__file__ = path
        self.pid = self._process.pid

    @property
    def returncode(self):
        return self._process.exitcode

    def poll(self):
        return self._process.exitcode

    def wait(self, timeout=None):
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self._process.exitcode

    def kill(self):
        # As Popen's: nothing once it has ended and been waited for.
        if self.poll() is None:
            os.kill(self.pid, signal.SIGKILL)


def _run(target, args, env, stdout, stderr, netns):
    """In the forked child: the target run as its own program, in a session
    of its own, its output to the given files."""
    os.setsid()
    if netns:
        _enter_network_namespace(netns)
    for fd, path in ((1, stdout), (2, stderr)):
        opened = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        os.dup2(opened, fd)
        os.close(opened)
    # Unbuffered, as PYTHONUNBUFFERED makes a real task's.
    sys.stdout, sys.stderr = (
        io.TextIOWrapper(io.FileIO(fd, 'w', closefd=False),
                         line_buffering=True, write_through=True)
        for fd in (1, 2))
    os.environ.clear()
    os.environ.update(env)
    os.chdir(REPO)
    try:
        if target.startswith('-m '):
            sys.argv = [target[3:]] + args
            runpy.run_module(target[3:], run_name='__main__', alter_sys=True)
        else:
            sys.argv = [target] + args
            runpy.run_path(target, run_name='__main__')
    except SystemExit:
        raise
    except KeyboardInterrupt:
        # As the interpreter ends on Ctrl-C: killed by SIGINT.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:  # as the interpreter ends on any other: status 1
        sys.excepthook(*sys.exc_info())
        sys.exit(1)


def _enter_network_namespace(name):
    """setns(2), which Python's os has from 3.12 on: this process's network
    is that of the namespace `ip netns add NAME` made."""
    fd = os.open('/run/netns/' + name, os.O_RDONLY)
    clone_newnet = 0x40000000
    if ctypes.CDLL(None, use_errno=True).setns(fd, clone_newnet):
        raise OSError(ctypes.get_errno(), 'setns ' + name)
    os.close(fd)
