"""The examples run commands and flags that exist; the image and a TFJob
run in containers."""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import uuid

import pytest
import yaml

from conftest import REPO, assert_clean_exit, evaluations, final_accuracies

EXAMPLES = os.path.join(REPO, 'examples')


def defined_flags(script):
    """The flags a script defines, as absl knows them."""
    module = os.path.basename(script)[:-len('.py')]
    return set(subprocess.run(
        [sys.executable, '-c', 'import %s\nfrom absl import flags\n'
         'print("\\n".join(flags.FLAGS))' % module],
        cwd=REPO, capture_output=True, text=True, check=True).stdout.split())


def check_command(argv):
    at = next(i for i, arg in enumerate(argv) if arg.endswith('.py'))
    script = argv[at]
    assert os.path.exists(os.path.join(REPO, os.path.basename(script)))
    known = defined_flags(script)
    given = [arg[2:].split('=')[0] for arg in argv[at:]
             if arg.startswith('--')]
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


@pytest.mark.parametrize('mode', ['async', 'sync'])
def test_slurm_batch_script(mode):
    with open(os.path.join(EXAMPLES, 'slurm-%s.sbatch' % mode)) as f:
        script = f.read().replace('\\\n', ' ')
    assert '#SBATCH --nodes=4' in script
    commands = [shlex.split(line) for line in script.splitlines()
                if line.startswith('srun ')]
    assert len(commands) == 1
    check_command(commands[0])
    assert '--num_ps=%d' % (1 if mode == 'async' else 2) in commands[0]


# No registry can be reached here: the Dockerfile's python:3.11-slim is
# stood in for by a Debian base made once per machine, with Python 3.11 and
# pip, pip not held back by Debian's EXTERNALLY-MANAGED (as in the image).
BASE = 'localhost/mnist-dist-test-base:bookworm'
IMAGE = 'localhost/mnist-dist:test'
# What pip trusts in the build is what the host trusts (a proxy that
# intercepts TLS has its own authority).
CA_BUNDLE = '/etc/ssl/certs/ca-certificates.crt'


def podman(*args, timeout=600):
    return subprocess.run(('podman',) + args, capture_output=True, text=True,
                          timeout=timeout)


def last_line(ran):
    lines = (ran.stdout + ran.stderr).strip().splitlines()
    return lines[-1] if lines else 'exit status %d' % ran.returncode


def make_base(folder):
    if not shutil.which('debootstrap'):
        pytest.skip('no base image %s, and no debootstrap to make one' % BASE)
    root = os.path.join(folder, 'root')
    made = subprocess.run(
        ['debootstrap', '--variant=minbase', '--include=python3,python3-pip',
         'bookworm', root, 'http://deb.debian.org/debian'],
        capture_output=True, text=True, timeout=600)
    if made.returncode:
        pytest.skip('debootstrap could not make a base image: %s'
                    % last_line(made))
    os.remove(os.path.join(root, 'usr/lib/python3.11/EXTERNALLY-MANAGED'))
    tar = subprocess.Popen(['tar', '-C', root, '-c', '.'],
                           stdout=subprocess.PIPE)
    imported = subprocess.run(['podman', 'import', '-', BASE], stdin=tar.stdout,
                              capture_output=True, text=True, timeout=300)
    tar.wait()
    shutil.rmtree(root)
    assert imported.returncode == 0, imported.stderr


@pytest.fixture(scope='module')
def image(tmp_path_factory):
    """The repository's Dockerfile, built with podman on BASE."""
    if not shutil.which('podman'):
        pytest.skip('no container can run here: podman is not installed')
    if podman('image', 'exists', BASE).returncode:
        make_base(str(tmp_path_factory.mktemp('base')))
    ran = podman('run', '--rm', '--network=none', BASE, 'true', timeout=60)
    if ran.returncode:
        pytest.skip('podman cannot run a container here: %s' % last_line(ran))
    trust = (['--volume=%s:%s:ro' % (CA_BUNDLE, CA_BUNDLE)]
             if os.path.exists(CA_BUNDLE) else [])
    built = podman('build', '--network=host', *trust,
                   '--build-arg=BASE=' + BASE, '--tag=' + IMAGE, REPO,
                   timeout=900)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr
    return IMAGE


def tfjob_containers(manifest, image, data_dir, logs, workers):
    """The podman commands that run a TFJob's pods as Kubeflow's training
    operator would: one container per replica, named as its service, on a
    network of their own, TF_CONFIG naming the cluster (with no evaluator:
    it is no task of the cluster) and the task, the volumes mounted, the
    manifest's command and arguments; the run cut to 4 epochs of 100 ms
    steps, so that every worker takes part."""
    with open(os.path.join(EXAMPLES, manifest)) as f:
        job = yaml.safe_load(f)
    replicas = job['spec']['tfReplicaSpecs']
    replicas['Worker']['replicas'] = workers
    name = '%s-%s' % (job['metadata']['name'], uuid.uuid4().hex[:6])

    def host(kind, index):
        return '%s-%s-%d' % (name, kind.lower(), index)

    cluster = {kind.lower(): ['%s:2222' % host(kind, i)
                              for i in range(spec['replicas'])]
               for kind, spec in replicas.items() if kind != 'Evaluator'}
    commands = {}
    for kind, spec in replicas.items():
        container, = spec['template']['spec']['containers']
        args = [arg.replace('--epochs=50', '--epochs=4')
                for arg in container['args']] + [
                    '--validation_size=100', '--step_delay_ms=100']
        for i in range(spec['replicas']):
            tf_config = {'cluster': cluster, 'environment': 'cloud',
                         'task': {'type': kind.lower(), 'index': i}}
            commands[host(kind, i)] = [
                'podman', 'run', '--rm', '--name=' + host(kind, i),
                '--network=' + name, '--env=TF_CONFIG=' + json.dumps(tf_config),
                '--volume=%s:/data/mnist:ro' % data_dir,
                '--volume=%s:/logs' % logs,
                '--entrypoint=' + container['command'][0], image,
            ] + container['command'][1:] + args
    return name, commands


@pytest.mark.slow
def test_tfjob_in_containers(image, procs, small_data, tmp_path):
    # 1 ps + 2 workers + the evaluator, each in a container of the image,
    # as the sync TFJob example runs them.
    logs = tmp_path / 'logs'
    logs.mkdir()
    network, commands = tfjob_containers('tfjob-sync.yaml', image,
                                         small_data, logs, workers=2)
    assert podman('network', 'create', network).returncode == 0
    try:
        running = {name: procs.start(command, name)
                   for name, command in commands.items()}
        procs.wait_all(list(running.values()), 240)
        outputs = {name: assert_clean_exit(procs, proc, 0)
                   for name, proc in running.items()}
    finally:
        podman('rm', '--force', '--time=0', *commands, timeout=60)
        podman('network', 'rm', '--force', network, timeout=60)
    evaluator = outputs[network + '-evaluator-0']
    finals = [final_accuracies(outputs['%s-worker-%d' % (network, i)])[i]
              for i in range(2)]
    for i in range(2):
        assert re.search(r'^worker=%d, local_steps=[1-9]' % i, outputs[
            '%s-worker-%d' % (network, i)], re.M)
    # 4 epochs of 10 steps; every worker ends with the last step's model.
    step, accuracy = evaluations(evaluator)[-1]
    assert step == 40, evaluator
    assert all(abs(accuracy - a) < 1e-6 for a in finals), finals
    assert (logs / 'sync-serving' / '40' / 'saved_model.pb').exists()
    assert podman('ps', '--all', '--quiet',
                  '--filter=name=' + network).stdout == ''
