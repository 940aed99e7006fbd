"""What TensorFlow 2's coordinator knows of its servers: which answer,
which stopped answering and came back, and the word it tells them."""

import time

from ps_cluster import exits, liveness, probes
from ps_cluster.deadlines import poll
from ps_cluster.exits import TaskFailed
from ps_cluster.tf2 import coordinated


def tasks(cluster, job):
    """{name: address} of the tasks of job in cluster."""
    return {'/job:%s/task:%d' % (job, i): address for i, address in
            enumerate(cluster.job_tasks(job))}


class Servers:
    """The ps tasks and workers of `cluster` (TensorFlow 2's ClusterSpec),
    as the coordinator, whose --task_index its lines carry, sees them."""

    # How often the coordinator asks its workers whether they answer, while
    # it waits for their steps.
    WORKER_CHECK_SECS = 2

    def __init__(self, cluster, task_index):
        self.cluster, self.task_index = cluster, task_index
        # The workers said not to answer, and when each last answered.
        self._gone, self._heard = set(), {}
        self.checked = time.monotonic()

    def tasks(self, job):
        return tasks(self.cluster, job)

    def wait_for_all(self, startup_timeout):
        """Until every ps and worker answers, or TaskFailed naming those
        that do not after startup_timeout (a Limit)."""
        servers = (self.cluster.job_tasks('ps')
                   + self.cluster.job_tasks('worker'))
        if not poll(lambda: all(map(probes.answers, servers)),
                    startup_timeout.secs, 0.2):
            raise TaskFailed('%s within %s' % (
                self.silent() or 'not every task answered', startup_timeout))

    def tell(self, word, secs=exits.TaskEnd.LAST_WORDS_SECS):
        """Tells every ps and worker the word, within secs; returns the
        names of those not told."""
        return coordinated.tell({**self.tasks('ps'), **self.tasks('worker')},
                                word, secs)

    def silent(self):
        """Which ps tasks and workers do not answer, in words."""
        silent = [name for name, _ in self.not_answering('ps', 'worker')]
        return silent and '%s do(es) not answer' % ', '.join(silent)

    def not_answering(self, *jobs):
        """The (name, address) of each task of jobs that does not
        answer."""
        return [(name, address) for job in jobs
                for name, address in self.tasks(job).items()
                if not probes.answers(address)]

    def check_workers(self):
        """Says once that a worker stopped answering, silent for GONE_SECS
        (a busy machine's worker answers late), and once that it is
        back."""
        now = self.checked = time.monotonic()
        for name, address in self.tasks('worker').items():
            self._heard.setdefault(name, now)
            if probes.answers(address):
                self._heard[name] = now
                if name in self._gone:
                    self._gone.discard(name)
                    print('worker=%d: %s (%s) is back' % (
                        self.task_index, name, address), flush=True)
            elif (name not in self._gone
                  and now - self._heard[name] > liveness.GONE_SECS):
                self._gone.add(name)
                print('worker=%d: %s (%s) does not answer: its steps go to '
                      'the other workers' % (self.task_index, name, address),
                      flush=True)
