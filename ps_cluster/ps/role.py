"""A ps task's role: it serves the run's variables until the run is over,
and leaves by itself."""

import threading

from ps_cluster.probes import STARTUP_GRACE_SECS
from ps_cluster.ps.ps_task import PsTask
from ps_cluster.settings import MIN_WORKERS
from ps_cluster.task import Task


class Ps(Task):
    """A ps task (a Task)."""

    def serve(self, ps_server):
        """server.join() for a ps task, but it ends: once every worker has
        come and gone, or fell silent for worker_timeout. It ends the
        task, with one line naming a worker that left on purpose and why,
        if one did."""
        settings = self.settings
        self.gpu.check(ps_server, self.config, 'ps', self.index)
        ps = PsTask(ps_server, self.place)
        self.end.before_leaving(
            lambda why: ps.tell_workers(why, self.end.LAST_WORDS_SECS))
        self.end.on_preemption(
            lambda: ps.preempted(settings.preemption_grace),
            settings.preemption_grace)
        if self.elastic:
            waits = ('the chief and every worker that came have ended; fewer '
                     'than %d workers (%s) for %s end the run'
                     % (self.min_workers, MIN_WORKERS,
                        settings.startup_timeout))
        else:
            waits = ('every worker has come and gone; one that has not come '
                     'within %g s (%s, and %d s for a worker to name the one '
                     'it waits for) ends the run'
                     % (*settings.startup_timeout, STARTUP_GRACE_SECS))
        print('%s: serving until %s' % (self.name, waits), flush=True)
        left = ps.serve_until_workers_gone(
            settings.startup_timeout, settings.worker_timeout,
            self.min_workers)
        # Ctrl-C or SIGTERM may have begun its end: its line is the last.
        if self.end.ending():
            threading.Event().wait()
        if left:
            index, reason = left[0]
            others = (' (and %d more: their own lines say why)'
                      % (len(left) - 1) if len(left) > 1 else '')
            print('%s: every worker has ended; %s left%s: "%s"'
                  % (self.name, self.place.task('worker', index), others,
                     reason), flush=True)
        self.end.leave()
