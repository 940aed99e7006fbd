"""The settings a task is handed: the flags, read once by cluster_utils.py,
each time limit with the flag that sets it, and the flags that lines
beneath name."""

import dataclasses

from ps_cluster.deadlines import Limit

# The flags that lines beneath name, beside a time limit's.
BATCH_SIZE = '--batch_size'
GPU_JOBS = '--gpu_jobs'
GPU_MEMORY_FRACTION = '--gpu_memory_fraction'
LOGDIR = '--logdir'
MIN_WORKERS = '--min_workers'
NUM_PS = '--num_ps'
POOL_THREADS = '--pool_threads'
REPLICAS_TO_AGGREGATE = '--replicas_to_aggregate'
STEPS_PER_RUN = '--steps_per_run'

# The time limits, by the flag that sets each.
LIMITS = ('startup_timeout', 'ps_timeout', 'stall_timeout', 'worker_timeout',
          'preemption_grace', 'eval_timeout')


@dataclasses.dataclass(frozen=True)
class Settings:
    """What a task's rooms read of its flags (each described at its flag in
    cluster_utils.py): the time limits as Limits, the others as values.
    A script's own flags are None where it has none (sync's
    replicas_to_aggregate)."""
    startup_timeout: Limit
    ps_timeout: Limit
    stall_timeout: Limit
    worker_timeout: Limit
    preemption_grace: Limit
    eval_timeout: Limit
    logdir: str
    save_checkpoint_secs: float
    export_dir: str
    eval_split: str
    data_dir: str
    data_mirror: str
    validation_size: int
    shard_data: bool
    split_w: bool
    pool_threads: int
    gpu_jobs: list
    gpu_memory_fraction: float
    min_workers: int
    min_workers_given: bool
    slurm_evaluator: bool
    tracebacks: bool
    epochs: int
    batch_size: int
    replicas_to_aggregate: int


def read(flags):
    """The Settings of absl's parsed `flags`."""
    values = {field.name: getattr(flags, field.name, None)
              for field in dataclasses.fields(Settings)
              if field.name not in LIMITS + ('min_workers_given',)}
    return Settings(
        **values, min_workers_given=flags['min_workers'].present,
        **{name: Limit(getattr(flags, name), '--' + name)
           for name in LIMITS})
