"""An evaluator's role: it measures the chief's checkpoints as they come,
and exports the last."""

import mnist_data
from ps_cluster import probes
from ps_cluster.evaluator import evaluator
from ps_cluster.logdir import Logdir
from ps_cluster.task import Task


class Evaluator(Task):
    """An evaluator (a Task), no task of the cluster: it follows the
    chief's checkpoints in logdir."""

    def evaluate(self, model, loss_and_accuracy, mnist, last_step,
                 logdir=None):
        """An evaluator's run: each new checkpoint in logdir, measured on
        eval_split, until the run's last, at last_step or where the chief
        ended; then, with export_dir, its SavedModel. It waits while the
        chief answers, and eval_timeout after. It ends the task; first,
        one line if it cannot write its summaries there. With `logdir` (a
        TF2 run's), it follows that, and the coordinator exports."""
        settings = self.settings
        export = logdir is None
        logdir = logdir or settings.logdir
        Logdir(logdir, self.name).check()
        split = mnist_data.as_float(getattr(mnist, settings.eval_split))
        chief = self.cluster['worker'][0]
        evaluator.follow(model, loss_and_accuracy, split, settings.eval_split,
                         logdir, last_step, settings.eval_timeout,
                         mnist_data.IMAGE_PIXELS, config=self.config,
                         on_last=export and (lambda step, values: (
                             self.export_model(model, values, step, mnist))),
                         chief_answers=lambda: probes.answers(chief))
        self.end.leave()
