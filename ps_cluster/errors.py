"""Reading TensorFlow's errors in a cluster: what went wrong, in one line,
which task was lost or misplaced; and the failure a coordinator holds."""

import re

import tensorflow.compat.v1 as tf
from tensorflow.python.framework import error_interpolation

from ps_cluster.exits import TaskFailed

# The errors of a run that lost a task: the connection broke, or the task
# restarted and no longer knows the session.
LOST = (tf.errors.UnavailableError, tf.errors.AbortedError)


class Stuck(tf.errors.AbortedError):
    """A training run that made no step for --stall_timeout while every
    task answers (a request that gRPC sent twice after a cut network was
    seen so): lost like a ps, so that a new session carries the run on."""


def stored(coord):
    """The failure stored in coord (a tf.train.Coordinator), if any: the
    first that any thread of this task met."""
    try:
        coord.raise_requested_exception()
    except Exception as e:  # any: raised again where the main thread is
        return e
    return None


def fail(coord, message):
    """Stores TaskFailed(message) in coord, from any thread, unless a
    failure is stored already; returns it."""
    failure = TaskFailed(message)
    coord.request_stop((TaskFailed, failure, None))
    return failure


def is_lost(error):
    """A LOST error, or a cancelled run that names a LOST error of a task
    among its errors: TensorFlow raises a run's first error, which may be
    the part of it cancelled because a RunGraph that gRPC sent again over
    a broken connection was refused by a ps that had received it."""
    return isinstance(error, LOST) or (
        isinstance(error, tf.errors.CancelledError) and re.search(
            r'^\s*(\(\d+\) )?(UNAVAILABLE|ABORTED|Unavailable|Aborted): '
            r'From /job:', error.message, re.M) is not None)


def is_ps_failure(error):
    """Whether error is of a lost ps as TensorFlow 2's own coordinator
    counts it (_is_ps_failure): a LOST or cancelled one, or a device or
    tensor handle that a ps started again at once no longer knows
    (tensorflow#62880)."""
    return isinstance(error, LOST + (tf.errors.CancelledError,)) or (
        isinstance(error, tf.errors.InvalidArgumentError) and (
            'unknown device' in error.message.lower()
            or 'Unable to find the relevant tensor remote_handle'
            in error.message))


def what_went_wrong(error):
    """The line of an error that says what went wrong: its first, or, in
    TensorFlow 2's 'Graph execution error', the one after the failed op's
    last 'Node:' line and the task it ran on; never the stack of where the
    op was defined, nor the function and op that TensorFlow 2 names
    around the cause."""
    # Several errors at once come numbered ('  (0) '), or between rules,
    # each after its status and task.
    lines = [ROOT.sub('', line) for line in getattr(
        error, 'message', str(error)).splitlines()]
    lines = [line for line in lines if not line.startswith((' ', '\t'))
             and not SAYS_NOTHING.fullmatch(line)]
    nodes = [i for i, line in enumerate(lines) if line.startswith('Node: ')]
    after = lines[nodes[-1] + 1:] if nodes else []
    return BOILERPLATE.sub('', (after or lines or [''])[0])


# The lines around a cause: TensorFlow 2's heading, and where it says a
# failed op was defined (a stack of indented lines after it); the count of
# a run's errors, and, in TensorFlow 1.15, each one's task and its rules.
SAYS_NOTHING = re.compile(r"|Graph execution error:|Detected at node '?\S+?'? "
                          r"defined at \(most recent call last\):|\d+ root "
                          r"error\(s\) found\.|(\w+: )?From /job:\S+:|=+")
ROOT = re.compile(r'^  \(\d+\) ')
# The wrapped function a cause ran in, and the op, around it.
BOILERPLATE = re.compile(r'^\{\{function_node [^}]*\}\} | \[Op:\w+\]$')


def lost_connection(place, error, missing=()):
    """'lost the connection to' a ps task of `missing` (found not
    answering), else to the task that a call in the error failed to reach,
    else to another task it names, never the task at `place` (a
    sources.Place), else to the ps tasks."""
    # The tasks named first may only have passed the error on: with 2 ps, a
    # live ps whose part of the step failed on the lost one.
    # Nor is this task lost: a call that this task's own server failed
    # (the ps behind it frozen) names it as the remote target.
    def named(prefix):
        return [(job, int(i)) for job, i in re.findall(
            prefix + r'/job:(\w+)/replica:\d+/task:(\d+)',
            error.message if error else '') if (job, int(i)) != place[1:]]
    # Older TF, 1.15 among them, names no remote target.
    lost = ([('ps', i) for i in sorted(missing)] or named('remote target ')
            or named(''))
    if not lost:
        return 'lost the connection to a ps task (%s)' % ','.join(
            place.cluster.job_tasks('ps'))
    return 'lost the connection to ' + place.task(*lost[0])


def misplaced(place, error):
    """TaskFailed if an InvalidArgumentError says that the task answering at
    an address of the cluster (`place`'s) is not the one the cluster puts
    there (the tasks were given clusters that differ); else the error."""
    unknown = re.search(r'/job:(\w+)/replica:\d+/task:(\d+)/\S+ unknown '
                        r'device', error.message)
    if not unknown:
        return error
    return TaskFailed('cannot place the model on %s: another task answers '
                      'there; give every task the same cluster' % place.task(
                          unknown.group(1), int(unknown.group(2))))


def parse_errors_in_linear_time():
    """TensorFlow 2.x parses the message of every error of a session run
    for node tags with a regex whose time grows faster than the square of
    the message's length (40,000 characters: 15 s), holding the GIL: a
    worker whose run failed after a ps restart hung for good in it, and no
    thread of its own could end it. The same parse, one tag at a time.
    A TensorFlow whose module differs (1.15's) is left alone."""
    tag_pattern = re.compile(getattr(error_interpolation, '_TAG_REGEX', ''))
    if {'type', 'name'} - set(tag_pattern.groupindex) or not hasattr(
            error_interpolation, '_ParseTag'):
        return
    parse_tag = error_interpolation._ParseTag

    def parse_message(message):
        kept, func_tags, node_tags, pos = [], [], [], 0
        for match in tag_pattern.finditer(message):
            tag = parse_tag(match.group('type'), match.group('name'))
            if tag.type == 'function_node':  # dropped from the message
                kept.append(message[pos:match.start()])
                func_tags.append(tag)
            else:
                kept.append(message[pos:match.end()])
                node_tags.append(tag)
            pos = match.end()
        kept.append(message[pos:])
        return ''.join(kept), func_tags, node_tags

    error_interpolation.parse_message = parse_message
