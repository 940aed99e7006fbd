"""For the in-process tests: the async script's flags and cluster, parsed in
the test's process as its run parses them."""

import sys

import pytest

import cluster_utils
from ps_cluster import exits
# The async script's own flags, defined as its run defines them.
import mnist_dist_async  # noqa: F401


def usage_error(args, env, monkeypatch, capsys):
    """The one line on stderr with which the script, given args and the
    environment variables env (and neither TF_CONFIG nor Slurm's otherwise),
    ends with exit status 2, before it builds anything."""
    for name in ('TF_CONFIG', 'SLURM_STEP_ID'):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(sys, 'argv', ['mnist_dist_async.py'] + args)
    try:
        with pytest.raises(SystemExit) as exited:
            cluster_utils.parse_flags(sys.argv)
            cluster_utils.this_task(False, exits.TaskEnd(lambda: 'unused'))
    finally:
        cluster_utils.FLAGS.unparse_flags()
    assert exited.value.code == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith('mnist_dist_async.py: error: ')
    return line
