"""The TensorFlow 1.15 line of requirements.txt, checked without Python 3.7.

What pip would install on Python 3.7 is asked of pip itself, with the
environment markers evaluated here for 3.7 (pip evaluates them for the
Python it runs on, even with --python-version). Proven here: that the
protobuf pip picks there loads TensorFlow 1.15.5's generated code, and that
every tf. name of the scripts, cluster_utils.py and ps_cluster/ (but tf2/,
TensorFlow 2's) exists in 1.15.5's tf.compat.v1. Not proven: that the
scripts run on 1.15 (that needs Python 3.7). Reads TensorFlow 1.15.5's
wheel (about 110 MB, its Python tree is the same as tensorflow-gpu's);
skips, saying why, where PyPI cannot be reached.
"""

import ast
import glob
import json
import os
import subprocess
import sys
import zipfile

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from conftest import REPO

pytestmark = pytest.mark.slow  # not in the fast tier

PY37 = {'python_version': '3.7', 'python_full_version': '3.7.17'}
FOR_PY37 = ['--python-version', '3.7', '--only-binary=:all:',
            '--platform', 'manylinux2014_x86_64',
            '--platform', 'manylinux2010_x86_64']
TF_USERS = (['mnist_dist_async.py', 'mnist_dist_sync.py', 'cluster_utils.py']
            + sorted(os.path.relpath(path, REPO) for path in glob.glob(
                os.path.join(REPO, 'ps_cluster', '**', '*.py'),
                recursive=True) if '/tf2/' not in path))
API = 'tensorflow_core/_api/v1/compat/v1/'


def pip(*args):
    result = subprocess.run([sys.executable, '-m', 'pip', *args],
                            capture_output=True, text=True, timeout=600)
    if result.returncode:
        errors = [line for line in result.stderr.splitlines()
                  if not line.startswith('WARNING')]
        pytest.skip('pip %s failed: %s' % (args[0], (errors or ['?'])[-1]))
    return result.stdout


def on_py37(requirements):
    """The requirements whose environment markers hold on Python 3.7."""
    return [r for r in map(Requirement, requirements)
            if r.marker is None or r.marker.evaluate(PY37)]


def read_requirements(path):
    with open(path) as f:
        lines = [line.split('#')[0].strip() for line in f]
    return on_py37(line for line in lines if line)


def chosen_on_py37(requirement, tmp_path):
    """(version, requires_dist) of what pip on Python 3.7 would install for
    one requirement, from the index's metadata alone. Its marker is left
    out: pip would evaluate it for this Python."""
    report = tmp_path / 'report.json'
    pip('install', '--dry-run', '--no-deps', '--ignore-installed', '--quiet',
        '--target', str(tmp_path / 'unused'), '--report', str(report),
        *FOR_PY37, requirement.name + str(requirement.specifier))
    metadata = json.loads(report.read_text())['install'][0]['metadata']
    return metadata['version'], metadata.get('requires_dist', [])


def protobuf_on_py37(requirements, tmp_path):
    """The protobuf version that pip would install on Python 3.7 for these
    requirements: their own protobuf bounds and TensorFlow's."""
    tensorflow = [r for r in requirements
                  if r.name in ('tensorflow', 'tensorflow-gpu')]
    assert [str(r.specifier) for r in tensorflow] == ['==1.15.5']
    _, requires = chosen_on_py37(tensorflow[0], tmp_path)
    bounds = SpecifierSet()
    for r in requirements + on_py37(requires):
        if r.name == 'protobuf':
            bounds &= r.specifier
    version, _ = chosen_on_py37(Requirement('protobuf' + str(bounds)),
                                tmp_path)
    return version


@pytest.fixture(scope='module')
def tf115_wheel(tmp_path_factory):
    folder = tmp_path_factory.mktemp('tf115')
    pip('download', '--no-deps', '--quiet', '--dest', str(folder), *FOR_PY37,
        'tensorflow==1.15.5')
    [wheel] = folder.glob('*.whl')
    with zipfile.ZipFile(wheel) as z:
        yield z


def load_generated_code(wheel, protobuf_version, tmp_path):
    """Imports every *_pb2 module of the wheel's core/framework and
    core/protobuf with protobuf_version, as built for this Python, and
    nothing else on the path. Returns (status, output)."""
    pip('install', '--no-deps', '--quiet', '--target',
        str(tmp_path / 'protobuf'), 'protobuf==' + protobuf_version)
    root = tmp_path / 'generated'
    modules = []
    for name in wheel.namelist():
        if name.startswith('tensorflow_core/') and name.endswith('_pb2.py'):
            # The generated code imports itself as tensorflow.*; empty
            # packages, so that nothing but generated code runs.
            module = name[len('tensorflow_core/'):-len('.py')].split('/')
            target = root.joinpath('tensorflow', *module[:-1])
            target.mkdir(parents=True, exist_ok=True)
            for package in [target, *target.parents][:len(module)]:
                (package / '__init__.py').touch()
            (target / (module[-1] + '.py')).write_bytes(wheel.read(name))
            if module[:2] in (['core', 'framework'], ['core', 'protobuf']):
                modules.append('.'.join(module))
    code = ('import sys; sys.path[:0] = %r\n'
            'import importlib, google.protobuf\n'
            'for m in %r: importlib.import_module("tensorflow." + m)\n'
            'from tensorflow.core.protobuf import config_pb2\n'
            'config_pb2.ConfigProto(device_filters=["/job:ps"])'
            '.SerializeToString()\n'
            'print("%d modules loaded with protobuf",'
            ' google.protobuf.__version__)'
            % ([str(tmp_path / 'protobuf'), str(root)], modules,
               len(modules)))
    # -S: no site-packages, so neither this venv's protobuf nor its
    # TensorFlow can stand in.
    result = subprocess.run([sys.executable, '-S', '-c', code],
                            capture_output=True, text=True, timeout=120)
    return result.returncode, result.stdout + result.stderr


def test_protobuf_of_the_tf115_line_loads_its_generated_code(tf115_wheel,
                                                             tmp_path):
    requirements = read_requirements(os.path.join(REPO, 'requirements.txt'))
    version = protobuf_on_py37(requirements, tmp_path)
    status, output = load_generated_code(tf115_wheel, version, tmp_path)
    assert status == 0, output
    assert 'modules loaded with protobuf %s\n' % version in output


def test_without_the_bound_pip_picks_a_protobuf_that_fails(tf115_wheel,
                                                          tmp_path):
    """What the bound in requirements.txt is for; and proof that the check
    above can fail."""
    requirements = [r for r in read_requirements(
        os.path.join(REPO, 'requirements.txt')) if r.name != 'protobuf']
    version = protobuf_on_py37(requirements, tmp_path)
    assert int(version.split('.')[0]) >= 4
    status, output = load_generated_code(tf115_wheel, version, tmp_path)
    assert status != 0
    assert 'your generated code is out of date' in output


def api_names(wheel):
    """dotted module path -> the names it binds, in 1.15.5's tf.compat.v1."""
    names = {}
    for path in wheel.namelist():
        if path.startswith(API) and path.endswith('__init__.py'):
            tree = ast.parse(wheel.read(path))
            module = os.path.dirname(path[len(API):]).replace('/', '.')
            names[module] = {alias.asname or alias.name.split('.')[0]
                             for node in ast.walk(tree)
                             if isinstance(node, (ast.Import, ast.ImportFrom))
                             for alias in node.names}
    return names


def missing_from(names, dotted):
    """The first part of the tf.a.b.c name `dotted` that 1.15.5 lacks, or
    None. Past a module, the rest are attributes of what it binds."""
    module, parts = '', dotted.split('.')
    for i, part in enumerate(parts):
        inner = (module + '.' + part).lstrip('.')
        if inner in names:
            module = inner
        elif part in names.get(module, ()):
            return None
        else:
            return '.'.join(parts[:i + 1])
    return None


def tf_names(path):
    """Every tf.x.y name that a file uses."""
    with open(os.path.join(REPO, path)) as f:
        tree = ast.parse(f.read())
    found = set()
    for node in ast.walk(tree):
        parts = []
        while isinstance(node, ast.Attribute):
            parts.insert(0, node.attr)
            node = node.value
        if parts and isinstance(node, ast.Name) and node.id == 'tf':
            found.add('.'.join(parts))
    return found


def test_every_tf_name_we_use_exists_in_tf115(tf115_wheel):
    names = api_names(tf115_wheel)
    used = set().union(*map(tf_names, TF_USERS))
    assert {'train.Supervisor', 'train.SyncReplicasOptimizer',
            'disable_v2_behavior'} <= used
    assert {name: missing_from(names, name) for name in sorted(used)
            if missing_from(names, name)} == {}
    # The check can fail: a name from TensorFlow 2.5, and one from nowhere.
    assert missing_from(names, 'config.experimental.get_memory_info')
    assert missing_from(names, 'train.NoSuchThing') == 'train.NoSuchThing'
