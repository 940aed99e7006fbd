"""The examples run commands and flags that exist."""

import os
import shlex
import subprocess
import sys

import pytest
import yaml

from conftest import REPO

EXAMPLES = os.path.join(REPO, 'examples')


def defined_flags(script):
    """The flags a script defines, as absl knows them."""
    module = os.path.basename(script)[:-len('.py')]
    return set(subprocess.run(
        [sys.executable, '-c', 'import %s\nfrom absl import flags\n'
         'print("\\n".join(flags.FLAGS))' % module],
        cwd=REPO, capture_output=True, text=True, check=True).stdout.split())


def check_command(argv):
    script = next(arg for arg in argv if arg.endswith('.py'))
    assert os.path.exists(os.path.join(REPO, os.path.basename(script)))
    known = defined_flags(script)
    given = [arg[2:].split('=')[0] for arg in argv if arg.startswith('--')]
    assert given and set(given) <= known, set(given) - known


@pytest.mark.parametrize('mode', ['async', 'sync'])
def test_tfjob_manifest(mode):
    with open(os.path.join(EXAMPLES, 'tfjob-%s.yaml' % mode)) as f:
        job = yaml.safe_load(f)
    assert job['kind'] == 'TFJob'
    replicas = job['spec']['tfReplicaSpecs']
    assert {name: spec['replicas'] for name, spec in replicas.items()} == {
        'PS': 1, 'Worker': 3, 'Evaluator': 1}
    for spec in replicas.values():
        container, = spec['template']['spec']['containers']
        assert container['name'] == 'tensorflow'  # what the operator expects
        argv = container['command'] + container['args']
        assert argv[1].endswith('mnist_dist_%s.py' % mode)
        # TF_CONFIG describes the cluster: no --ps, --worker or --job_name.
        assert not any(a.startswith(('--ps', '--worker', '--job_name'))
                       for a in argv)
        check_command(argv)
        # The checkpoints on a volume that every pod mounts.
        mounts = {m['mountPath'] for m in container['volumeMounts']}
        assert {'/data', '/logs'} <= mounts


def test_slurm_batch_script():
    with open(os.path.join(EXAMPLES, 'slurm-async.sbatch')) as f:
        script = f.read().replace('\\\n', ' ')
    assert '#SBATCH --nodes=4' in script
    commands = [shlex.split(line) for line in script.splitlines()
                if line.startswith('srun ')]
    assert len(commands) == 1
    check_command(commands[0])
    assert '--num_ps=1' in commands[0]
