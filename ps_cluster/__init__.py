"""What keeps a parameter-server cluster of cluster_utils.py running, one
module per concern: where the cluster comes from (sources), how a task ends
(exits), reading TensorFlow's errors (errors), the server (server), the
chief's --logdir (logdir), whether a task is up (probes), which tasks live
(liveness), a ps's end of a run (ps_task), the stall watch (stall_watch),
where a worker's model comes from (session_start), the session that outlives
a lost ps (recoverable_session), sync's tokens (sync_tokens), how stale the
gradients are (staleness), what each ps holds (placement), what a worker
reports (training_log), the evaluator (evaluator) and the SavedModel for
serving (export).

Nothing here reads a flag: settings come in as arguments.
"""
