"""A worker's stall watch: a thread that stores a run that makes no step as
a failure, in the coordinator of the session the worker trains in, and ends
the worker only when its main thread stays stuck in TensorFlow with a
failure stored."""

import contextlib
import threading
import time

from ps_cluster import errors, liveness, probes
from ps_cluster.deadlines import call_within


class StallWatch(threading.Thread):
    """Watches the main thread's calls into TensorFlow (calling()) and the
    global step (step(), from the Watchdog), and stores what it finds in
    the coordinator of the session being made or run (store_in()).

    No failure stored: a call during which the step has stood still for
    `limit` (a deadlines.Limit, --stall_timeout's), or for the outage's
    while a ps task does not answer (for
    liveness.GONE_SECS: a probe may fail as a cut heals), is a failure,
    which names the ps tasks that do not answer, else the workers whose
    beats stand still (`place`, this worker's; in an `elastic` run, of
    those that came); but the first such run while every task answers is
    errors.Stuck, after which a new session is tried, and so is a call that
    has lasted `limit` while the others' steps go on, once until a training
    run returns. A failure stored: the watch closes the session the main
    thread runs in, which cancels the run, and the main thread raises it;
    if the main thread is still inside the same call GRACE_SECS after the
    close, the watch ends the worker (`end`), its last resort: TensorFlow
    waits for a ps that is gone with no timeout as it opens a session, and
    a frozen ps blocks even the closing. A lost ps's failure closes
    nothing, and ends the worker only once the wait for it is over:
    `outage` (a deadlines.Outage, --ps_timeout's) is the clock of that
    wait, which a recovery reads too."""

    # How often it looks at the main thread's call; a probe it makes may
    # take ten polls (_within()).
    POLL_SECS = 0.5
    # Closing a session on a live ps cancels its runs within a second.
    GRACE_SECS = 3

    def __init__(self, end, place, limit, outage, elastic=False):
        super().__init__(daemon=True, name='stall watch')
        self.end, self.place, self.elastic = end, place, elastic
        self.limit, self.outage = limit, outage
        # The Watchdog writes the step, the main thread its call and the
        # coordinator.
        self._lock = threading.Lock()
        self._step, self._moved = None, time.monotonic()
        self._call, self._coord = None, None
        # The step at which a new session was last tried for a stuck run.
        self._stuck_at = None
        # Whether a new session was tried for a run stuck alone, until a
        # training run returns; since when a ps has not answered the
        # watch's probes, until one answers or a step.
        self._alone, self._silent_since = False, None
        self._closed = threading.Event()

    def store_in(self, coord):
        """From now on, what the watch finds goes to coord, a new
        session's Coordinator."""
        with self._lock:
            self._coord = coord

    def step(self, value):
        """The global step as the Watchdog just read it: a step once it
        differs from the one read before."""
        with self._lock:
            if value != self._step and self._step is not None:
                self._moved, self._silent_since = time.monotonic(), None
                self.outage.over()
            self._step = value

    @contextlib.contextmanager
    def calling(self, what, session=None, deadline=None, trains=False):
        """The main thread is inside a call into TensorFlow, `what`, until
        the block ends; closing `session` cancels it. A call of a wait
        with a `deadline` (a Deadline) is a failure once it has passed
        while a ps task does not answer; one of none, once the step stands
        still too long. A call that `trains` (a training run) and returns
        ends a run stuck alone: a recovery's own calls do not."""
        # A new tuple each call: the watch tells calls apart by identity.
        with self._lock:
            self._call = (what, session, deadline, time.monotonic())
        try:
            yield
            if trains:
                with self._lock:
                    self._alone = False
        finally:
            with self._lock:
                self._call = None

    def close(self):
        """Training is over: the main thread raises what fails now."""
        self._closed.set()
        self.join()

    def run(self):
        stuck = None  # (the call, since when: its session's close)
        while not self._closed.wait(self.POLL_SECS):
            with self._lock:
                call, moved, coord = self._call, self._moved, self._coord
            failure = coord and errors.stored(coord)
            if call and coord and failure is None:
                failure = self._stalled(coord, call, moved)
            # A run on a lost ps fails by itself; closing would wait on it.
            lost = errors.is_lost(failure) and not isinstance(
                failure, errors.Stuck)
            if call is None or failure is None:
                stuck = None
            elif stuck is None or stuck[0] is not call:
                if call[1] is not None and not lost:
                    self._within(call[1].close)
                stuck = call, time.monotonic()
            elif (not self.outage.deadline().left() if lost
                  else time.monotonic() > stuck[1] + self.GRACE_SECS):
                with self._lock:
                    still = self._call is call
                if still:
                    self.end.fail(self._line(failure))  # it ends the worker

    def _stalled(self, coord, call, moved):
        """The failure, stored, if the step has stood still too long during
        the call: a TaskFailed that names why, or errors.Stuck; else
        None."""
        what, _, deadline, entered = call
        now = time.monotonic()
        idle = now - max(moved, entered)
        if not deadline and moved > entered \
                and now - entered > self.limit.secs \
                and now - moved < liveness.GONE_SECS:
            # The others' steps go on (async; the step moved during the
            # call and still moves: a frozen ps stops it for all): this
            # worker's run alone is stuck. A new session, once until a
            # training run returns.
            line = ('no step of its own for %s, waiting in %s, while the '
                    'global step goes on' % (self.limit, what))
            with self._lock:
                again, self._alone = self._alone, True
            if again:
                return errors.fail(coord, 'training stalled: %s, in a new '
                                   'session too' % line)
            return self._stuck(coord, line)
        if deadline and deadline.left() or not deadline and idle <= min(
                self.limit.secs, self.outage.limit.secs):
            return None
        silent = self._within(probes.silent, self.place.cluster, 'ps') or []
        # Silent once it has not answered for GONE_SECS: a probe may fail
        # as a network cut heals, or on a busy machine.
        with self._lock:
            if not silent:
                self._silent_since = None
            elif self._silent_since is None:
                self._silent_since = now
            if silent and now - self._silent_since < liveness.GONE_SECS:
                return None
        if deadline:
            return errors.fail(
                coord, 'lost the connection to %s, waiting in %s: not done %s'
                % (self.place.task('ps', silent[0]), what, deadline)
            ) if silent else None
        if silent:
            why = ', '.join(self.place.task('ps', i) + ' does not answer'
                            for i in silent)
        if idle > self.limit.secs:
            limit = self.limit
            if not silent:
                workers = self._within(liveness.silent_workers, self.place,
                                       self.elastic)
                why = 'missing: ' + (', '.join(
                    ['unknown'] if workers is None else workers) or 'none')
                with self._lock:
                    # Once a step, and for the call still made: a new
                    # session may carry the run on.
                    stuck = workers == [] and self._stuck_at != self._step \
                        and self._call is call and self._coord is coord
                    if stuck:
                        self._stuck_at = self._step
                if stuck:
                    return self._stuck(
                        coord, 'no new global step for %s, waiting in %s, '
                        'while every task answers' % (limit, what))
        elif silent:
            limit = self.outage.limit
        else:
            return None
        return errors.fail(
            coord, 'training stalled: no new global step for %s, waiting '
            'in %s; %s' % (limit, what, why))

    @staticmethod
    def _stuck(coord, message):
        """errors.Stuck(message), stored: a new session is tried."""
        stuck = errors.Stuck(None, None, message)
        coord.request_stop((errors.Stuck, stuck, None))
        return stuck

    def _line(self, failure):
        """What the worker ends with: a lost ps's, once the wait for it is
        over."""
        if not errors.is_lost(failure) or isinstance(failure, errors.Stuck):
            return errors.what_went_wrong(failure)
        return '%s, which did not come back %s' % (
            errors.lost_connection(
                self.place, failure,
                self._within(probes.silent, self.place.cluster, 'ps') or ()),
            self.outage.deadline())

    def _within(self, function, *args):
        """function(*args), or None if it blocks past POLL_SECS * 10 (a
        frozen ps) or fails."""
        with contextlib.suppress(Exception):  # none expected: it goes on
            return call_within(self.POLL_SECS * 10, function, *args)
