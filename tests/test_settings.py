"""The settings a task is handed (ps_cluster/settings.py): the flags as
cluster_utils.py reads them once, each time limit with its flag; and the
rooms beneath, which name a flag only through them and import only the
ground and their own room."""

import ast
import glob
import os
import re
import sys

from conftest import REPO
import cluster_utils
from ps_cluster import settings
from ps_cluster.deadlines import Limit
# The async script's own flags, defined as its run defines them.
import mnist_dist_async  # noqa: F401

GROUND = os.path.join(REPO, 'ps_cluster')
ROOMS = ('worker', 'ps', 'evaluator', 'tf2')


def test_the_flags_read_once_with_each_limit_named(monkeypatch):
    monkeypatch.setattr(sys, 'argv', [
        'mnist_dist_async.py', '--job_name=worker', '--ps_timeout=30',
        '--min_workers=3'])
    try:
        cluster_utils.parse_flags(sys.argv)
        read = settings.read(cluster_utils.FLAGS)
    finally:
        cluster_utils.FLAGS.unparse_flags()
    assert read.ps_timeout == Limit(30, '--ps_timeout')
    assert str(read.ps_timeout) == '30 s (--ps_timeout)'
    assert str(read.stall_timeout) == '180 s (--stall_timeout)'
    assert {name: type(getattr(read, name)) for name in settings.LIMITS} == {
        name: Limit for name in settings.LIMITS}
    # Sync's own flag, which async has not.
    assert (read.replicas_to_aggregate, read.min_workers,
            read.min_workers_given) == (None, 3, True)
    assert read.epochs == 50 and read.logdir is None


def strings_beneath():
    """(path, line, text) of each string in ps_cluster/ that is no
    docstring."""
    for path in glob.glob(os.path.join(GROUND, '**', '*.py'), recursive=True):
        tree = ast.parse(open(path).read())
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.ClassDef,
                                           ast.FunctionDef))
                      and node.body and isinstance(node.body[0], ast.Expr)}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                    and id(node) not in docstrings):
                yield os.path.relpath(path, REPO), node.lineno, node.value


def flags_defined():
    """The names of the flags that cluster_utils.py and the scripts
    define."""
    names = set()
    for path in ('cluster_utils.py', 'mnist_dist_async.py',
                 'mnist_dist_sync.py', 'mnist_dist_tf2.py'):
        for node in ast.walk(ast.parse(open(os.path.join(REPO, path)).read())):
            if (isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr.startswith('DEFINE_')):
                names.add(node.args[0].value)
    return names


def test_a_flag_is_named_beneath_only_in_the_settings():
    ours = flags_defined()
    assert {'ps_timeout', 'replicas_to_aggregate', 'steps_per_run'} <= ours
    named = [(path, line, text) for path, line, text in strings_beneath()
             if path != 'ps_cluster/settings.py' and set(
                 re.findall(r'--(\w+)', text)) & ours]
    assert named == []


def test_each_room_imports_the_ground_and_itself_only():
    wrong = []
    for path in glob.glob(os.path.join(GROUND, '**', '*.py'), recursive=True):
        room = os.path.relpath(os.path.dirname(path), GROUND)
        for node in ast.walk(ast.parse(open(path).read())):
            # Each name imported, whole: ps_cluster.worker.watchdog for
            # 'from ps_cluster.worker import watchdog' too.
            names = ([(node.module or '') + '.' + a.name for a in node.names]
                     if isinstance(node, ast.ImportFrom)
                     else [a.name for a in node.names]
                     if isinstance(node, ast.Import) else [])
            for name in names:
                parts = name.split('.')
                if parts[0] in ('cluster_utils', 'tf2_utils') or (
                        parts[0].startswith('mnist_dist')):
                    wrong.append((path, name))  # up
                elif (parts[0] == 'ps_cluster' and len(parts) > 1
                        and parts[1] in ROOMS and parts[1] != room):
                    wrong.append((path, name))  # beside, or from the ground
    assert wrong == []
