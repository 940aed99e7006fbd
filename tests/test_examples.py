"""The examples run commands and flags that exist; the image and a TFJob
run in containers."""

import concurrent.futures
import glob
import json
import os
import re
import shlex
import shutil
import subprocess
import time
import uuid

import kubernetes_validate
import pytest
import yaml

import kubelet
from conftest import (FINAL_STEP, REPO, START_UP, assert_clean_exit,
                      evaluations, final_accuracies, script_help)

# Real processes and containers, in turn with the others (pytest.ini).
pytestmark = pytest.mark.xdist_group('real')

EXAMPLES = os.path.join(REPO, 'examples')
# The Kubernetes release whose API schemas (kubernetes-validate's copy of
# them) the manifests of built-in kinds are checked against.
K8S_SCHEMA = '1.37.0'


def defined_flags(script):
    """The flags a script defines, as its --help lists them."""
    stdout, _, _ = script_help(re.search(r'mnist_dist_(\w+)\.py$',
                                         script).group(1))
    return set(re.findall(r'^  --(?:\[no\])?(\w+):', stdout, re.M))


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
    assert '#SBATCH --nodes=%d' % (2 if mode == 'async' else 4) in script
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
    steps."""
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
    chief = network + '-worker-0'
    try:
        # The chief last, once the others know their cluster: a sync chief
        # up first may take every token of a short run.
        running = {name: procs.start(command, name)
                   for name, command in commands.items() if name != chief}
        for proc in running.values():
            procs.wait_for_output(proc, r': cluster from TF_CONFIG: ',
                                  START_UP)
        running[chief] = procs.start(commands[chief], chief)
        procs.wait_all(list(running.values()), START_UP)
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


# ------------------------------------------------------------------ JobSet

def jobset(mode, kind='JobSet'):
    """The JobSet of examples/jobset-MODE.yaml, or the document of another
    kind there."""
    return kubelet.manifests(os.path.join(EXAMPLES,
                                          'jobset-%s.yaml' % mode))[kind]


def replicated_jobs(manifest):
    """{replicated job's name: its Job's spec}."""
    return {replicated['name']: replicated['template']['spec']
            for replicated in manifest['spec']['replicatedJobs']}


@pytest.mark.parametrize('mode', ['async', 'sync'])
def test_jobset_manifest(mode):
    manifest = jobset(mode)
    assert kubelet.crd_problems(manifest) == []
    spec = manifest['spec']
    assert manifest['metadata']['labels']['kueue.x-k8s.io/queue-name']
    # The set succeeds once its workers and its evaluator have: a finished
    # set deletes the Jobs still running, and the evaluator's last
    # measurement would go with it.
    assert spec['successPolicy'] == {
        'operator': 'All', 'targetReplicatedJobs': ['workers', 'evaluator']}
    assert spec['failurePolicy']['maxRestarts'] >= 1
    # A ps that fails restarts in place, on its address, and the workers
    # wait for it; a worker that fails fails its Job, which restarts the
    # set.
    jobs = replicated_jobs(manifest)
    assert jobs['ps']['backoffLimit'] >= 1
    assert jobs['ps']['template']['spec']['restartPolicy'] == 'OnFailure'
    assert jobs['workers']['backoffLimit'] == 0
    assert jobs['workers']['template']['spec']['restartPolicy'] == 'Never'
    pods = kubelet.jobset_pods(manifest, {'mnist-data': '/claims/data',
                                          'mnist-logs': '/claims/logs'})
    cluster = {job: ','.join(pod.fqdn + ':2222' for pod in pods
                             if pod.replicated_job == job)
               for job in ('ps', 'workers')}
    for pod in pods:
        assert pod.argv[1] == '/app/mnist_dist_%s.py' % mode
        # Time to save the model when preempted (SIGTERM), whose default
        # --preemption_grace the pod's grace period is above.
        if pod.replicated_job != 'evaluator':
            assert pod.grace > 20 and '--preemption_grace' not in str(
                pod.argv)
        check_command(pod.argv)
        # Every pod the same cluster, of the DNS names JobSet gives the
        # pods; each its task from its index.
        assert '--ps=' + cluster['ps'] in pod.argv
        assert '--worker=' + cluster['workers'] in pod.argv
        job = {'workers': 'worker'}.get(pod.replicated_job,
                                        pod.replicated_job)
        assert '--job_name=' + job in pod.argv
        if job != 'evaluator':
            assert '--task_index=' + pod.env['JOB_COMPLETION_INDEX'] in (
                pod.argv)
        # The data and the logdir on volumes every pod mounts.
        assert sorted(path for _, path, _ in pod.mounts) == ['/data',
                                                             '/logs']
        assert '--logdir=/logs/' + mode in pod.argv
        assert ('--export_dir=/logs/%s-serving' % mode in pod.argv) == (
            job == 'worker')
        # A GPU for each worker; the ps and the evaluator keep off them.
        assert pod.gpus == (1 if job == 'worker' else 0)


@pytest.mark.parametrize('mode', ['async', 'sync', 'async-elastic'])
def test_network_policy_admits_only_the_sets_own_pods(mode):
    """Beside each JobSet, a NetworkPolicy, valid in Kubernetes' own schema
    of networking.k8s.io/v1, that covers every pod of the set and admits to
    their port the set's own pods alone: the labels its selectors name are
    those the JobSet controller gives every pod of this set, and no other
    set's."""
    policy = jobset(mode, 'NetworkPolicy')
    kubernetes_validate.validate(policy, K8S_SCHEMA, strict=True)
    misspelled = dict(policy, spec=dict(policy['spec'], podSelecter={}))
    with pytest.raises(kubernetes_validate.ValidationError,
                       match="'podSelecter' was unexpected"):
        kubernetes_validate.validate(misspelled, K8S_SCHEMA, strict=True)
    spec = policy['spec']
    assert spec['policyTypes'] == ['Ingress']
    (rule,) = spec['ingress']
    (source,) = rule['from']
    assert set(source) == {'podSelector'}  # no namespace, no address block
    claims = {'mnist-data': '/claims/data', 'mnist-logs': '/claims/logs'}
    manifest = jobset(mode)
    pods = kubelet.jobset_pods(manifest, claims)
    other = 'async' if mode == 'sync' else 'sync'
    others = kubelet.jobset_pods(jobset(other), claims)
    for selector in (spec['podSelector'], source['podSelector']):
        assert all(kubelet.selects(selector, pod.labels) for pod in pods)
        assert not any(kubelet.selects(selector, pod.labels)
                       for pod in others)
    ports = {port['containerPort'] for job in replicated_jobs(
        manifest).values() for port in job['template']['spec'][
            'containers'][0].get('ports', [])}
    assert rule['ports'] == [{'protocol': 'TCP', 'port': port}
                             for port in sorted(ports)]


def test_elastic_jobset_manifest():
    manifest = jobset('async-elastic')
    assert kubelet.crd_problems(manifest) == []
    # Not under Kueue, whose elastic workloads take no JobSet.
    assert 'labels' not in manifest['metadata']
    assert manifest['spec']['successPolicy']['targetReplicatedJobs'] == [
        'workers']
    jobs = replicated_jobs(manifest)
    assert jobs['workers']['parallelism'] == jobs['workers']['completions']
    started = jobs['workers']['parallelism']
    pods = kubelet.jobset_pods(manifest, {'mnist-data': '/claims/data',
                                          'mnist-logs': '/claims/logs'})
    # Every worker the set may have, by the DNS names JobSet would give
    # them; it starts with --min_workers of them.
    most = ['mnist-dist-async-elastic-workers-0-%d.mnist-dist-async-elastic'
            ':2222' % i for i in range(4)]
    for pod in pods:
        check_command(pod.argv)
        assert '--worker=' + ','.join(most) in pod.argv
        assert '--min_workers=%d' % started in pod.argv
        assert pod.grace > 20  # a removed worker says it left, in its grace
        assert pod.gpus == (pod.replicated_job == 'workers')
    assert [pod.fqdn + ':2222' for pod in pods
            if pod.replicated_job == 'workers'] == most[:started]


def test_a_jobset_the_api_server_would_refuse_is_named():
    manifest = jobset('async')
    manifest['spec']['sucessPolicy'] = manifest['spec'].pop('successPolicy')
    manifest['spec']['replicatedJobs'][0]['replicas'] = 'one'
    problems = kubelet.crd_problems(manifest)
    assert ".spec.sucessPolicy: unknown field, not in JobSet's schema" in (
        problems)
    assert ".spec.replicatedJobs[0].replicas: 'one' is not of type " \
        "'integer'" in problems


def test_a_pod_it_cannot_make_as_kubernetes_would_fails():
    manifest = jobset('async')
    pod = manifest['spec']['replicatedJobs'][0]['template']['spec'][
        'template']['spec']
    pod['nodeSelector'] = {'disk': 'ssd'}
    with pytest.raises(kubelet.Untranslated, match=r'^\.spec\.replicatedJobs'
                       r'\[0\]\.template\.spec\.template\.spec\.nodeSelector'
                       r': not translated$'):
        kubelet.jobset_pods(manifest, {'mnist-data': '/d', 'mnist-logs': '/l'})
    del pod['nodeSelector']
    pod['containers'][0]['args'].append('--logdir=/logs/$(POD_NAME)')
    with pytest.raises(kubelet.Untranslated,
                       match='no environment variable POD_NAME'):
        kubelet.jobset_pods(manifest, {'mnist-data': '/d', 'mnist-logs': '/l'})
    assert kubelet.expand('$$(HOME) $(A)', {'A': 'a'}) == '$(HOME) a'


class JobSetRun:
    """A JobSet run here as Kubernetes would run it: each pod a podman
    container of the image on a network of the set's own, started as the
    kubelet starts it (kubelet.py), and this test as the JobSet controller:
    the set succeeds once every pod of successPolicy's jobs has; a pod of
    restartPolicy OnFailure that fails is started again in place, on its
    address; another that fails restarts the whole set, up to
    failurePolicy.maxRestarts. suspend() is Kueue's: every pod stopped as
    its grace period allows, and the set started again."""

    def __init__(self, manifest, image, claims, procs):
        self.manifest, self.image, self.procs = manifest, image, procs
        self.claims = claims
        self.pods = kubelet.jobset_pods(manifest, claims)
        self.network = '%s-%s' % (manifest['metadata']['name'],
                                  uuid.uuid4().hex[:6])
        self.restarts, self.attempts, self.in_place = 0, [], 0
        assert podman('network', 'create', self.network).returncode == 0

    def start(self):
        """Every pod's container, for a new attempt of the set."""
        self.attempts.append({})
        for pod in self.pods:
            self._run(pod)

    def _run(self, pod):
        """pod's container in the current attempt, again if it ran."""
        running = self.attempts[-1]
        name = '%s-%d' % (pod.hostname, len(self.attempts) - 1)
        if pod.hostname in running:
            self.in_place += 1
            name += '-again%d' % self.in_place
        running[pod.hostname] = self.procs.start(kubelet.podman_run(
            pod, self.image, self.network, '%s-%s' % (self.network, name)),
            name)
        running[pod.hostname].container = '%s-%s-%s' % (
            self.network, name, pod.hostname)

    def again(self, replicated_job):
        """The pods of replicated_job, started again in place."""
        for pod in self.pods:
            if pod.replicated_job == replicated_job:
                self._run(pod)

    def scale(self, name, count):
        """An Elastic JobSet's patch of a replicated job's parallelism and
        completions to count: the pods of new indices start; those of the
        highest, beyond count, stop as the Job removes them (SIGTERM, then
        SIGKILL after their grace). Returns the processes of those
        removed."""
        job = replicated_jobs(self.manifest)[name]
        job['parallelism'] = job['completions'] = count
        pods = kubelet.jobset_pods(self.manifest, self.claims)
        running, kept = self.attempts[-1], {pod.hostname for pod in pods}
        removed = [pod for pod in self.pods if pod.hostname not in kept]
        self.pods = pods
        for pod in pods:
            if pod.hostname not in running:
                self._run(pod)
        if removed:
            podman('stop', '--time=%d' % max(pod.grace for pod in removed),
                   *[running[pod.hostname].container for pod in removed],
                   timeout=120)
        return [running[pod.hostname] for pod in removed]

    def container(self, hostname):
        return self.attempts[-1][hostname].container

    def pods_of(self, replicated_job):
        running = self.attempts[-1]
        return [running[pod.hostname] for pod in self.pods
                if pod.replicated_job == replicated_job]

    def run(self, timeout):
        """Attempts of the set until its workers succeed (True) or it fails
        for good (False), within timeout seconds."""
        deadline = time.time() + timeout
        jobs = replicated_jobs(self.manifest)
        policy = self.manifest['spec']
        while time.time() < deadline:
            running = self.attempts[-1]
            failed = [pod for pod in self.pods
                      if running[pod.hostname].poll() not in (None, 0)]
            for pod in failed:
                if pod.restarts_in_place:
                    self._run(pod)  # as the kubelet does, in its pod
            if [pod for pod in failed if not pod.restarts_in_place]:
                if self.restarts == policy['failurePolicy']['maxRestarts']:
                    return False
                self.restarts += 1
                self.stop()
                self.start()
                continue
            targets = [p for job in policy['successPolicy'][
                'targetReplicatedJobs'] for p in self.pods_of(job)]
            assert set(jobs) >= set(policy['successPolicy'][
                'targetReplicatedJobs'])
            if all(p.poll() == 0 for p in targets):
                return True
            time.sleep(0.2)
        pytest.fail('the JobSet %s did not end within %d s'
                    % (self.network, timeout))

    def stop(self, grace=5):
        """The containers of the attempt, stopped as the pods of a deleted
        Job are: SIGTERM, then SIGKILL after the grace period."""
        running = list(self.attempts[-1].values())
        podman('stop', '--ignore', '--time=%d' % grace,
               *[proc.container for proc in running], timeout=60 + grace)
        self.procs.wait_all(running, START_UP)

    def suspend(self):
        """Kueue suspends the set: each pod is deleted, SIGTERM then SIGKILL
        once its grace period is over; admitted again, every pod starts
        anew."""
        self.stop(max(pod.grace for pod in self.pods))
        self.start()

    def remove(self):
        for attempt in self.attempts:
            podman('rm', '--force', '--ignore', '--time=0',
                   *[proc.container for proc in attempt.values()], timeout=60)
        podman('network', 'rm', '--force', self.network, timeout=60)

    def left(self):
        return (podman('ps', '--all', '--quiet',
                       '--filter=name=' + self.network).stdout,
                podman('network', 'exists', self.network).returncode == 0)


def shortened(manifest, *flags):
    """The manifest's run cut to a test's: 10 epochs of 100 ms steps of the
    small data, a checkpoint every second."""
    for job in replicated_jobs(manifest).values():
        container, = job['template']['spec']['containers']
        container['args'] = [a.replace('--epochs=50', '--epochs=10')
                             for a in container['args']] + [
            '--validation_size=100', '--step_delay_ms=100',
            '--save_checkpoint_secs=1', '--print_every_epochs=1'] + list(
                flags)
    return manifest


@pytest.mark.slow
def test_jobsets_in_containers(image, procs, small_data, tmp_path):
    """Both JobSets side by side, pod by pod in containers, each preempted
    twice mid-run: its ps alone (SIGTERM) while the workers keep their
    pods, which restarts in place; then every pod, as Kueue suspends the
    set, which is admitted again. Each time the run resumes at the step the
    chief saved (or at its checkpoint loop's, after it), and the set
    completes."""
    data = tmp_path / 'data'
    shutil.copytree(small_data, str(data / 'mnist'))
    runs = {}

    def preempt(run):
        chief = run.pods_of('workers')[0]
        procs.wait_for_output(chief, r'^worker=0,epoch=2,', START_UP)
        ps, = run.pods_of('ps')
        podman('kill', '--signal=TERM', ps.container, timeout=30)
        procs.wait_all([ps], START_UP)
        saved = procs.wait_for_output(chief, r'^worker=0: saved the model '
                                      r'at global_step=(\d+)$', START_UP)
        assert ps.returncode == 143
        assert procs.stderr(ps).endswith(
            '/job:ps/task:0: preempted; the chief saved the model at '
            'global_step=%s\n' % saved.group(1))
        run.again('ps')  # as the kubelet does, in its pod
        run.resumed = [procs.wait_for_output(chief, RESTORED, START_UP).group(
            1) == saved.group(1)]
        procs.wait_for_output(chief, r'^worker=0,epoch=5,', START_UP)
        run.suspend()
        saved = re.search(r'^worker=0: preempted: saved the model at '
                          r'global_step=(\d+)$', procs.output(chief), re.M)
        # Or at a later checkpoint, of updates that came after.
        run.resumed.append(int(procs.wait_for_output(
            run.pods_of('workers')[0], RESTORED, START_UP).group(1))
            >= int(saved.group(1)))
        return run.run(600)
    try:
        for mode in ('async', 'sync'):
            logs = tmp_path / ('logs-' + mode)
            logs.mkdir()
            runs[mode] = JobSetRun(shortened(jobset(mode)), image, {
                'mnist-data': str(data), 'mnist-logs': str(logs)}, procs)
            runs[mode].logs = logs
            runs[mode].start()
        with concurrent.futures.ThreadPoolExecutor(len(runs)) as pool:
            outcome = dict(zip(runs, pool.map(preempt, runs.values())))
        # The ps and the evaluator end by themselves once the workers
        # have.
        for run in runs.values():
            procs.wait_all(list(run.attempts[-1].values()), START_UP)
    finally:
        for run in runs.values():
            run.remove()
    assert outcome == {'async': True, 'sync': True}
    for mode, run in runs.items():
        assert (run.restarts, run.in_place, run.resumed) == (0, 1,
                                                             [True, True])
        last = run.attempts[-1]
        outputs = {host: assert_clean_exit(procs, proc, 0)
                   for host, proc in last.items()}
        workers = [o for host, o in sorted(outputs.items())
                   if '-workers-' in host]
        assert [sorted(final_accuracies(o)) for o in workers] == [
            [0], [1], [2]]
        # The run's last step, the last worker's to end, exported once and
        # measured last by the evaluator.
        step = max(int(s) for o in workers for _, s in FINAL_STEP.findall(o))
        evaluator, = [o for host, o in outputs.items()
                      if '-evaluator-' in host]
        assert evaluations(evaluator)[-1][0] == step
        assert os.listdir(run.logs / ('%s-serving' % mode)) == [str(step)]
        assert run.left() == ('', False)


RESTORED = (r'^worker=0: restored the model from \S+ at global_step=(\d+), ')


@pytest.mark.slow
def test_an_elastic_jobset_in_containers(image, procs, small_data, tmp_path):
    """The elastic JobSet, pod by pod in containers, scaled as its comment
    says: 2 workers, then 4 once the chief has trained 2 epochs, then 3:
    the pod of index 3, removed, gets SIGTERM, and leaves. The set
    completes, its workers each at their last epoch, and the ps ends by
    itself, having counted who came and left."""
    data = tmp_path / 'data'
    shutil.copytree(small_data, str(data / 'mnist'))
    logs = tmp_path / 'logs'
    logs.mkdir()
    run = JobSetRun(shortened(jobset('async-elastic'), '--epochs=40'), image,
                    {'mnist-data': str(data), 'mnist-logs': str(logs)}, procs)
    try:
        run.start()
        procs.wait_for_output(run.pods_of('workers')[0], r'^worker=0,epoch=2,',
                              START_UP)
        run.scale('workers', 4)
        procs.wait_for_output(run.pods_of('workers')[3], r'^worker=3,epoch=1,',
                              START_UP)
        removed, = run.scale('workers', 3)
        assert run.run(600)
        procs.wait_all(list(run.attempts[-1].values()), START_UP)
    finally:
        run.remove()
    assert procs.stderr(removed).endswith(
        '/job:worker/task:3: left on SIGTERM; the others train on\n')
    assert_clean_exit(procs, removed, 143)
    workers = [assert_clean_exit(procs, pod, 0)
               for pod in run.pods_of('workers')]
    assert [sorted(final_accuracies(o)) for o in workers] == [[0], [1], [2]]
    ps, = run.pods_of('ps')
    assert ('/job:ps/task:0: every worker that came has ended: 4 of the 4 '
            'listed came, 1 left') in assert_clean_exit(procs, ps, 0)
    assert run.left() == ('', False)


def vcjob():
    return kubelet.load(os.path.join(EXAMPLES, 'vcjob-tf2.yaml'))


def test_vcjob_manifest():
    manifest = vcjob()
    assert kubelet.crd_problems(manifest, kubelet.VOLCANO_CRD) == []
    spec = manifest['spec']
    assert set(spec['plugins']) == {'svc', 'tensorflow'}
    # Gang-scheduled: every pod at once, or none.
    assert spec['minAvailable'] == sum(t['replicas'] for t in spec['tasks'])
    chief, = [t for t in spec['tasks'] if t['name'] == 'chief']
    assert chief['policies'] == [{'event': 'TaskCompleted',
                                  'action': 'CompleteJob'}]
    pods = kubelet.vcjob_pods(manifest, {'mnist-data': '/claims/data',
                                         'mnist-logs': '/claims/logs'})
    assert sorted(pod.replicated_job for pod in pods) == [
        'chief', 'evaluator', 'ps', 'worker', 'worker']
    for pod in pods:
        check_command(pod.argv)
        # The cluster and the task from TF_CONFIG alone.
        assert not [a for a in pod.argv if a.split('=')[0] in (
            '--ps', '--worker', '--job_name', '--task_index')]
        assert '--logdir=/logs/tf2' in pod.argv
        if pod.replicated_job in ('ps', 'chief'):  # they save when preempted
            assert pod.grace > 20
        # A GPU for each worker that trains; the coordinator, the ps and
        # the evaluator keep off them.
        assert pod.gpus == (1 if pod.replicated_job == 'worker' else 0)


@pytest.mark.slow
def test_vcjob_in_containers(image, procs, small_data, tmp_path):
    """Volcano's Job of the TF2 script pod by pod, each with the TF_CONFIG
    Volcano's tensorflow plugin writes (a chief job, the evaluator listed):
    the chief completes, and so the Job; the others end with it, and the
    evaluator measures the last checkpoint."""
    data, logs = tmp_path / 'data', tmp_path / 'logs'
    shutil.copytree(small_data, str(data / 'mnist'))
    logs.mkdir()
    manifest = vcjob()
    for task in manifest['spec']['tasks']:
        container, = task['template']['spec']['containers']
        container['args'] = [a.replace('--epochs=50', '--epochs=4')
                             for a in container['args']] + [
            '--validation_size=100', '--print_every_epochs=1',
            '--learning_rate=0.5']
    pods = kubelet.vcjob_pods(manifest, {'mnist-data': str(data),
                                         'mnist-logs': str(logs)})
    network = 'mnist-dist-tf2-%s' % uuid.uuid4().hex[:6]
    assert podman('network', 'create', network).returncode == 0
    try:
        running = {pod.replicated_job + str(i): procs.start(
            kubelet.podman_run(pod, image, network, network), pod.hostname)
            for i, pod in enumerate(pods)}
        procs.wait_all(list(running.values()), START_UP)
    finally:
        podman('rm', '--force', '--ignore', '--time=0', *[
            '%s-%s' % (network, pod.hostname) for pod in pods], timeout=60)
        podman('network', 'rm', '--force', network, timeout=60)
    # Every pod's status and output, should one end badly: a worker left
    # waiting for the coordinator's word ended 1 once (not reproduced).
    assert all(proc.returncode == 0 for proc in running.values()), '\n'.join(
        '--- %s: %s\n%s' % (name, proc.returncode, procs.output(proc))
        for name, proc in running.items())
    outputs = {name: assert_clean_exit(procs, proc, 0)
               for name, proc in running.items()}
    chief, = [o for name, o in outputs.items() if name.startswith('chief')]
    # 4 epochs of 10 steps for each of 3 workers, as the async script counts.
    assert final_accuracies(chief)[0] > 0.9
    assert os.listdir(logs / 'tf2-serving') == ['120']
    evaluator, = [o for name, o in outputs.items()
                  if name.startswith('evaluator')]
    assert evaluations(evaluator)[-1][0] == 120


def containers_of(document):
    """Every container of a manifest's pods, whatever its kind."""
    if isinstance(document, dict):
        for key, value in document.items():
            if key == 'containers':
                yield from value
            else:
                yield from containers_of(value)
    elif isinstance(document, list):
        for value in document:
            yield from containers_of(value)


@pytest.mark.parametrize('name', sorted(
    os.path.basename(path) for path in glob.glob(os.path.join(EXAMPLES,
                                                              '*.yaml'))))
def test_each_pod_takes_its_share_and_a_gpu_an_image_with_cuda(name):
    # A CPU limit: without a quota a task sizes its pools to the whole node.
    # A container that asks for a GPU runs the image that the Dockerfile
    # builds with CUDA, which the manifest's comment says how to build.
    with open(os.path.join(EXAMPLES, name)) as f:
        text = f.read()
    containers = list(containers_of(list(yaml.safe_load_all(text))))
    assert containers
    for container in containers:
        limits = container['resources']['limits']
        assert limits['cpu'] == container['resources']['requests']['cpu']
        gpu = 'nvidia.com/gpu' in limits
        assert container['image'].endswith(':gpu' if gpu else ':latest')
        if gpu:
            assert ('podman build --build-arg TF_EXTRAS=and-cuda -t '
                    'mnist-dist:gpu .' in ' '.join(
                        line.lstrip('# ') for line in text.splitlines()))
    with open(os.path.join(REPO, 'Dockerfile')) as f:
        dockerfile = f.read()
    assert ('podman build --build-arg TF_EXTRAS=and-cuda -t mnist-dist:gpu .'
            in dockerfile)
    assert '${TF_EXTRAS:+"tensorflow[$TF_EXTRAS]"}' in dockerfile
