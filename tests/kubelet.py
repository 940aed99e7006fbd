"""For test_examples.py: a JobSet or Volcano Job manifest checked against
its own CRD schema, and its pods as their controllers (and Volcano's
plugins) and the kubelet would make them, each to be run as a podman
container.

The translation knows the fields the examples use, and fails on any other,
and on a $(VAR) that no environment variable of the container defines: a
pod it cannot make as Kubernetes would is no test of the manifest."""

import collections
import json
import os
import re

import jsonschema
import yaml

# JobSet's CRD, copied unchanged from kubernetes-sigs/jobset (its origin in
# tests/data/README.md).
CRD = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'data',
                   'jobset.x-k8s.io_jobsets.yaml')
# Volcano's Job CRD, copied unchanged from volcano-sh/volcano (the same).
VOLCANO_CRD = os.path.join(os.path.dirname(CRD), 'batch.volcano.sh_jobs.yaml')

Pod = collections.namedtuple('Pod', [
    'hostname', 'fqdn', 'replicated_job', 'labels', 'env', 'argv', 'mounts',
    'cpu_shares', 'restarts_in_place', 'grace', 'gpus'])

# The fields translated, by where they sit; a field elsewhere fails.
KNOWN = {
    'jobset': {'apiVersion', 'kind', 'metadata', 'spec'},
    'jobset.metadata': {'name', 'labels'},
    'jobset.spec': {'network', 'successPolicy', 'failurePolicy',
                    'replicatedJobs'},
    'replicatedJob': {'name', 'replicas', 'template'},
    'job': {'parallelism', 'completions', 'completionMode', 'backoffLimit',
            'template'},
    'vcjob.spec': {'schedulerName', 'minAvailable', 'plugins', 'policies',
                   'tasks'},
    'task': {'name', 'replicas', 'policies', 'template'},
    'pod': {'restartPolicy', 'terminationGracePeriodSeconds', 'containers',
            'volumes'},
    'container': {'name', 'image', 'command', 'args', 'env', 'ports',
                  'volumeMounts', 'resources'},
}


class Untranslated(Exception):
    """A manifest this translation cannot make pods of as Kubernetes
    would."""


def load(path):
    with open(path) as f:
        return yaml.safe_load(f)


def manifests(path):
    """{kind: document} of a file of several YAML documents."""
    with open(path) as f:
        return {document['kind']: document
                for document in yaml.safe_load_all(f)}


def selects(selector, labels):
    """Whether a label selector of matchLabels alone selects labels."""
    if set(selector) != {'matchLabels'}:
        raise Untranslated('selector %s: only matchLabels is translated'
                           % selector)
    return selector['matchLabels'].items() <= labels.items()


def crd_problems(manifest, crd=CRD):
    """What the API server would refuse in manifest, by the CRD at `crd`
    (JobSet's by default), or prune from it unseen (a field its schema does
    not name), one line each."""
    crd = load(crd)
    version, = [v for v in crd['spec']['versions']
                if v['name'] == manifest['apiVersion'].split('/')[1]]
    schema = version['schema']['openAPIV3Schema']
    problems = ['%s: %s' % (''.join(
        '[%d]' % part if isinstance(part, int) else '.' + part
        for part in error.absolute_path) or '.', error.message)
                for error in jsonschema.Draft7Validator(schema).iter_errors(
                    manifest)]
    return problems + ['%s: unknown field, not in %s\'s schema' % (
        path, manifest['kind']) for path in _unknown(manifest, schema, '')]


def _unknown(value, schema, path):
    """The paths of value's fields that its schema does not name."""
    if schema.get('x-kubernetes-preserve-unknown-fields'):
        return []
    if isinstance(value, dict) and 'properties' in schema:
        return [found for key, item in value.items()
                for found in ([path + '.' + key] if key not in schema[
                    'properties'] else _unknown(item, schema['properties'][
                        key], path + '.' + key))]
    if isinstance(value, dict) and isinstance(
            schema.get('additionalProperties'), dict):
        return [found for key, item in value.items() for found in _unknown(
            item, schema['additionalProperties'], path + '.' + key)]
    if isinstance(value, list) and 'items' in schema:
        return [found for i, item in enumerate(value) for found in _unknown(
            item, schema['items'], '%s[%d]' % (path, i))]
    return []


def _only(where, value, path):
    unknown = set(value) - KNOWN[where]
    if unknown:
        raise Untranslated('%s.%s: not translated' % (path, sorted(unknown)[0]))


def expand(text, env):
    """A command or argument as the kubelet expands it: $(NAME) is the
    value of the container's variable NAME, $$ a $; a $(NAME) that no
    variable defines, which the kubelet would leave as it is, fails."""
    def value(match):
        if match.group(0) == '$$':
            return '$'
        if match.group(1) not in env:
            raise Untranslated('%r: no environment variable %s'
                               % (text, match.group(1)))
        return env[match.group(1)]
    return re.sub(r'\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)', value, text)


def jobset_pods(manifest, claims):
    """The pods of a JobSet, one Pod each: its hostname and DNS name
    (<jobset>-<replicatedJob>-<jobIndex>-<podIndex>.<subdomain>), the labels
    the JobSet controller gives it (the set's and the replicated job's
    names), the environment the Job controller gives an Indexed Job's pod
    (JOB_COMPLETION_INDEX) and the container's own, its command and args
    expanded, its volumes as (host folder, path, read only) from claims
    ({claim name: host folder}), its CPU request as the kubelet's CPU
    shares (1024 a CPU), whether it restarts in place, its grace period,
    and the GPUs it asks for."""
    _only('jobset', manifest, '')
    _only('jobset.metadata', manifest['metadata'], '.metadata')
    spec = manifest['spec']
    _only('jobset.spec', spec, '.spec')
    name = manifest['metadata']['name']
    subdomain = spec.get('network', {}).get('subdomain', name)
    pods = []
    for r, replicated in enumerate(spec['replicatedJobs']):
        path = '.spec.replicatedJobs[%d]' % r
        _only('replicatedJob', replicated, path)
        job = replicated['template']['spec']
        _only('job', job, path + '.template.spec')
        pod = job['template']['spec']
        _only('pod', pod, path + '.template.spec.template.spec')
        container, = pod['containers']
        _only('container', container,
              path + '.template.spec.template.spec.containers[0]')
        volumes = {v['name']: claims[v['persistentVolumeClaim']['claimName']]
                   for v in pod.get('volumes', [])}
        for job_index in range(replicated.get('replicas', 1)):
            for index in range(job.get('parallelism', 1)):
                hostname = '%s-%s-%d-%d' % (name, replicated['name'],
                                            job_index, index)
                env = {}
                if job.get('completionMode') == 'Indexed':
                    env['JOB_COMPLETION_INDEX'] = str(index)
                for variable in container.get('env', []):
                    if set(variable) != {'name', 'value'}:
                        raise Untranslated('%s: env %s: only a value is '
                                           'translated' % (path,
                                                           variable['name']))
                    env[variable['name']] = expand(variable['value'], env)
                cpu = container.get('resources', {}).get(
                    'requests', {}).get('cpu')
                labels = {'jobset.sigs.k8s.io/jobset-name': name,
                          'jobset.sigs.k8s.io/replicatedjob-name':
                          replicated['name']}
                pods.append(Pod(
                    hostname, '%s.%s' % (hostname, subdomain),
                    replicated['name'], labels, env,
                    [expand(a, env) for a in container['command']
                     + container.get('args', [])],
                    [(volumes[m['name']], m['mountPath'],
                      m.get('readOnly', False))
                     for m in container.get('volumeMounts', [])],
                    cpu and _cpu_shares(str(cpu)),
                    pod['restartPolicy'] == 'OnFailure',
                    pod.get('terminationGracePeriodSeconds', 30),
                    _gpus(container)))
    return pods


def vcjob_pods(manifest, claims):
    """The pods of a Volcano Job of the svc and tensorflow plugins, one Pod
    each, as jobset_pods(): hostname <job>-<task>-<index>, DNS name under
    the Job's name, and the TF_CONFIG the tensorflow plugin writes: every
    task of the Job by its role (its task's name), on port 2222, this pod's
    type and index."""
    _only('vcjob.spec', manifest['spec'], '.spec')
    name = manifest['metadata']['name']
    tasks = manifest['spec']['tasks']
    cluster = {task['name']: ['%s-%s-%d.%s:2222' % (
        name, task['name'], i, name) for i in range(task['replicas'])]
        for task in tasks}
    pods = []
    for t, task in enumerate(tasks):
        path = '.spec.tasks[%d]' % t
        _only('task', task, path)
        pod = task['template']['spec']
        _only('pod', pod, path + '.template.spec')
        container, = pod['containers']
        _only('container', container, path + '.template.spec.containers[0]')
        volumes = {v['name']: claims[v['persistentVolumeClaim']['claimName']]
                   for v in pod.get('volumes', [])}
        for index in range(task['replicas']):
            hostname = '%s-%s-%d' % (name, task['name'], index)
            env = {'TF_CONFIG': json.dumps({'cluster': cluster, 'task': {
                'type': task['name'], 'index': index}})}
            pods.append(Pod(
                hostname, '%s.%s' % (hostname, name), task['name'],
                {'volcano.sh/job-name': name}, env,
                container['command'] + container.get('args', []),
                [(volumes[m['name']], m['mountPath'],
                  m.get('readOnly', False))
                 for m in container.get('volumeMounts', [])],
                _cpu_shares(str(container['resources']['requests']['cpu'])),
                pod['restartPolicy'] == 'OnFailure',
                pod.get('terminationGracePeriodSeconds', 30),
                _gpus(container)))
    return pods


def _gpus(container):
    """The GPUs a container asks for (NVIDIA's device plugin's
    resource): its run here gets none, as on a node without GPUs."""
    return int(container.get('resources', {}).get('limits', {}).get(
        'nvidia.com/gpu', 0))


def _cpu_shares(quantity):
    """The kubelet's cpu.shares for a CPU request: 1024 a CPU."""
    millis = (int(quantity[:-1]) if quantity.endswith('m')
              else round(float(quantity) * 1000))
    return millis * 1024 // 1000


def podman_run(pod, image, network, prefix):
    """The podman command that starts pod as the kubelet would, in a
    container named prefix-HOSTNAME: its hostname, its names on the pods'
    network (the DNS name JobSet gives it too), its labels, environment,
    mounts and CPU shares, the image's entrypoint replaced by the
    command."""
    return (['podman', 'run', '--rm', '--name=%s-%s' % (prefix, pod.hostname),
             '--hostname=' + pod.hostname, '--network=' + network,
             '--network-alias=' + pod.hostname,
             '--network-alias=' + pod.fqdn]
            + ['--label=%s=%s' % item for item in sorted(pod.labels.items())]
            + ['--env=%s=%s' % item for item in sorted(pod.env.items())]
            + ['--volume=%s:%s%s' % (host, path, ':ro' if read_only else '')
               for host, path, read_only in pod.mounts]
            + (['--cpu-shares=%d' % pod.cpu_shares] if pod.cpu_shares else [])
            + ['--entrypoint=' + pod.argv[0], image] + pod.argv[1:])
