"""This task's GPU: which one it uses, said in a line, and the one-line end
of a task that cannot use the GPU it was given."""

import os

import tensorflow.compat.v1 as tf

from ps_cluster import errors, server
from ps_cluster.exits import TaskFailed
from ps_cluster.settings import GPU_JOBS, GPU_MEMORY_FRACTION


class Gpu:
    """The GPU of the task at `place` (a sources.Place; `address`, its own,
    None for an evaluator), by `settings`' gpu_jobs: `index`, among the
    GPUs this process sees, or None, said in a line by a task of gpu_jobs,
    and by a worker or coordinator that keeps off the GPUs; `name`; and
    `given`, a GPU given that TensorFlow cannot see. `coordinator`: worker
    0 is TensorFlow 2's coordinator."""

    def __init__(self, settings, place, address, coordinator=False):
        self.settings, self.place = settings, place
        jobs = settings.gpu_jobs

        def role(job, index):
            return ('coordinator' if coordinator and (job, index) == (
                'worker', 0) else job)
        mine = role(place.job, place.index)
        seen = ('CUDA_VISIBLE_DEVICES' in os.environ
                and ' (CUDA_VISIBLE_DEVICES=%s)'
                % os.environ['CUDA_VISIBLE_DEVICES'])
        gpus = tf.config.experimental.list_physical_devices('GPU')
        num_gpus, self.name, self.index = len(gpus), '', None
        # A GPU given that TensorFlow cannot see ends the task, once it can
        # tell the cluster (check_given()): never a silent fall-back.
        self.given = mine in jobs and not num_gpus and server.gpu_given()
        if mine not in jobs or not num_gpus:
            if mine in jobs + ['worker', 'coordinator'] and not self.given:
                print('%s: on the CPU: %s%s' % (place.name, (
                    'no GPU found' if mine in jobs else
                    '%s=%s' % (GPU_JOBS, ','.join(jobs))), seen or ''),
                    flush=True)
            return
        cap = settings.gpu_memory_fraction and (
            ', at most %g of it (%s)' % (settings.gpu_memory_fraction,
                                         GPU_MEMORY_FRACTION))
        gpu, dealt = 0, ''
        if address:  # not an evaluator, outside the cluster
            cluster = place.cluster
            users = [task for job in ('ps', 'worker')
                     for i, task in enumerate(cluster.job_tasks(job))
                     if role(job, i) in jobs]
            gpu, rank, count = server.deal_gpu(users, address, num_gpus)
            dealt = ', GPU task %d of %d on %s' % (
                rank + 1, count, address.rpartition(':')[0])
        # TensorFlow 1.15 has no word for a GPU's name.
        details = getattr(tf.config.experimental, 'get_device_details',
                          lambda gpu: {})
        self.name = details(gpus[gpu]).get('device_name', '')
        print('%s: on GPU %d of %d%s%s; memory as it needs it'
              % (place.name, gpu, num_gpus, seen or '', dealt) + (cap or ''),
              flush=True)
        self.index = gpu

    def check_given(self):
        """Ends this task, status 1, if it was given a GPU (gpu_jobs) that
        TensorFlow cannot use, in one line: TensorFlow's reason, and the
        ways out."""
        if self.given:
            raise TaskFailed(
                'given a GPU (%s) that TensorFlow cannot use: %s. Use an '
                'image with CUDA (the Dockerfile\'s --build-arg '
                'TF_EXTRAS=and-cuda) or pip install \'tensorflow[and-cuda]\''
                ', or train on the CPU: %s=' % (
                    self.given, server.why_no_gpu(), GPU_JOBS))

    def check(self, task_server, config, job, index):
        """Ends this task, status 1, if it cannot use its GPU, in one line
        (line())."""
        if self.index is None:
            return
        _, failure = server.check_gpu(
            task_server.target, config,
            '/job:%s/replica:0/task:%d/device:GPU:0' % (job, index))
        if failure is not None:
            raise TaskFailed(self.line(failure, 'keep the %s tasks off the '
                                       'GPUs (%s)' % (job, GPU_JOBS)))

    def line(self, error, change=None):
        """The line of a failure of this task's GPU: which one, what went
        wrong in TensorFlow's words, the memory it asked for, and what to
        change; None for an error that is none of a GPU's own (`change`,
        for any error)."""
        found = self.index is not None and server.gpu_failure(error.message)
        if not (found or change):
            return None
        cause, change = found or (None, change)
        fraction = self.settings.gpu_memory_fraction
        cap = ('at most %g of its memory (%s)' % (fraction,
                                                  GPU_MEMORY_FRACTION)
               if fraction else 'its memory as it needs it, with no cap')
        return 'cannot use GPU %d%s: %s; it asked for %s: %s' % (
            self.index, self.name and ' (%s)' % self.name,
            '%s (%s)' % (cause, errors.what_went_wrong(error)) if cause
            else errors.what_went_wrong(error), cap, change)
