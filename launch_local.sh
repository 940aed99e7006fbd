#!/usr/bin/env bash
# Runs a parameter-server cluster on this machine: NUM_PS ps tasks and
# NUM_WORKERS worker tasks of mnist_dist_async.py, mnist_dist_sync.py or
# mnist_dist_tf2.py, one process each, with one log per task in RUN_DIR.
# Prints each worker's final accuracy; exits 0 if every task did, 1 if any
# failed, 130 if interrupted, 143 if terminated (SIGTERM, as a scheduler
# preempts: the chief saves the model first). Every process it started is
# gone when it returns, whichever way. `compare` runs async, then sync
# (then tf2, with -t), with the same flags and a --logdir each, and
# compares them with launcher/compare.py; `straggler` does the same with
# the last worker slowed, and adds a sync run with a backup worker.
#
# By default the cluster runs in a private network namespace with only a
# loopback device: TensorFlow's server has no authentication and listens on
# every interface, so nothing else should be able to reach it. -H runs it on
# the host's network instead.
set -u

usage_line="usage: $0 [-n NUM_WORKERS] [-m MIN_WORKERS [-l SECS]] [-p NUM_PS] [-b BASE_PORT] [-o RUN_DIR] [-s MS] [-e] [-t] [-H] {async|sync|tf2|compare|straggler} [script flags...]"

usage() {
  echo "$usage_line" >&2
  echo "$0 -h prints the help" >&2
  exit 2
}

print_help() {
  cat <<EOF
$usage_line

Runs a parameter-server cluster on this machine, one process per task, and
prints each worker's final accuracy.

modes:
  async     mnist_dist_async.py: each worker applies its own updates
  sync      mnist_dist_sync.py: SyncReplicasOptimizer aggregates them
  tf2       mnist_dist_tf2.py: TensorFlow 2's ParameterServerStrategy;
            worker 0 is its coordinator, the others train
  compare   async, then sync (then tf2, with -t), with the same flags and a
            --logdir each, then launcher/compare.py's table and chart of
            the runs
  straggler compare's runs with the last worker slowed (-s, 20 ms by
            default), then sync with one backup worker
            (--replicas_to_aggregate one below the workers), in one table

options:
  -n NUM_WORKERS  worker tasks (default 3)
  -m MIN_WORKERS  async or sync, elastic: start these of the workers, the
                  rest -l seconds later if the chief still trains
                  (--min_workers)
  -l SECS         when the rest of -m's workers start (default 30)
  -p NUM_PS       ps tasks (default 1)
  -b BASE_PORT    first port: the ps tasks', then the workers' (default 9001)
  -o RUN_DIR      one log per task here (default runs/MODE-DATE-TIME)
  -s MS           the last worker's gradients wait MS ms each step: a
                  straggler (--step_delay_ms)
  -e              an evaluator beside the cluster: it measures each of the
                  chief's checkpoints (--logdir, by default RUN_DIR/logdir)
  -t              compare: a third run, tf2, after async and sync
  -H              on the host's network, not a private network namespace
  -h, --help      this help

Flags after the mode go to every task of the script as they are, e.g.
--epochs=5 --data_dir=~/.cache/mnist --logdir=/tmp/run; python3
mnist_dist_async.py --help lists them. ~ at the start of --data_dir and
--logdir is the home directory.

exit status: 0 if every task did, 1 if any task failed, 2 on a usage error,
130 if interrupted (SIGINT: every task is stopped first), 143 if
terminated (SIGTERM: every task preempted, the chief saving the model).
EOF
  exit 0
}

args=("$@")
num_workers=3 num_ps=1 base_port=9001 run_dir='' host_network=0 evaluator=0
with_tf2=0
slow_ms='' min_workers='' later=30
while getopts 'n:m:l:p:b:o:s:etHh-:' opt; do
  case $opt in
    n) num_workers=$OPTARG ;;
    m) min_workers=$OPTARG ;;
    l) later=$OPTARG ;;
    p) num_ps=$OPTARG ;;
    b) base_port=$OPTARG ;;
    o) run_dir=$OPTARG ;;
    s) slow_ms=$OPTARG ;;
    e) evaluator=1 ;;
    t) with_tf2=1 ;;
    H) host_network=1 ;;
    h) print_help ;;
    -) [[ $OPTARG == help ]] && print_help; usage ;;
    *) usage ;;
  esac
done
shift $((OPTIND - 1))
[[ $# -ge 1 && $1 =~ ^(async|sync|tf2|compare|straggler)$ ]] || usage
mode=$1
shift
[[ $mode == straggler ]] && slow_ms=${slow_ms:-20}
for n in "$num_workers" "$num_ps" "$base_port" "$later" ${slow_ms:+"$slow_ms"} ${min_workers:+"$min_workers"}; do
  [[ $n =~ ^[1-9][0-9]*$ ]] || { echo "$0: error: '$n' is not a positive number" >&2; exit 2; }
done
if [[ -n $min_workers ]] && { [[ ! $mode =~ ^(async|sync)$ ]] || ((min_workers > num_workers)); }; then
  echo "$0: error: -m starts some of the -n workers of async or sync" >&2
  exit 2
fi
if ((with_tf2)) && [[ $mode != compare ]]; then
  echo "$0: error: -t adds a tf2 run to compare alone" >&2
  exit 2
fi
if [[ $mode == tf2 ]] || ((with_tf2)); then
  # What mnist_dist_tf2.py does not take, refused before any run.
  [[ -n $slow_ms ]] && { echo "$0: error: mnist_dist_tf2.py has no straggler (-s)" >&2; exit 2; }
fi
if [[ $mode == straggler || $mode == tf2 ]] && ((num_workers < 2)); then
  echo "$0: error: $mode needs 2 workers or more" >&2
  exit 2
fi
last_port=$((base_port + num_ps + num_workers - 1))
((last_port < 65536)) || { echo "$0: error: ports $base_port-$last_port do not exist" >&2; exit 2; }

here=$(cd "$(dirname "$0")" && pwd)
python=${PYTHON:-python3}

# The private network, each of its steps tried before the cluster is put
# there: some systems let a user make a namespace but not configure its
# network (Ubuntu 23.10 on). LAUNCH_LOCAL_UNSHARE: how the tests make one
# that cannot be configured.
unshare_net=(${LAUNCH_LOCAL_UNSHARE:-unshare --user --map-root-user --net})
refused_step() {
  "${unshare_net[@]}" true 2>/dev/null ||
    { echo "making a network namespace (${unshare_net[*]})"; return; }
  command -v ip > /dev/null || { echo "finding ip (iproute2) to bring up its loopback"; return; }
  "${unshare_net[@]}" ip link set lo up 2>/dev/null ||
    echo "bringing up its loopback (ip link set lo up)"
}
if ((host_network == 0)) && [[ -z ${LAUNCH_LOCAL_NETNS:-} ]]; then
  refused=$(refused_step)
  if [[ -z $refused ]]; then
    # Nothing in the namespace reaches another host: get the data here, once
    # for every task; a data problem ends the run before any task starts.
    "$python" "$here/mnist_data.py" "$@" || exit
    LAUNCH_LOCAL_NETNS=1 exec "${unshare_net[@]}" bash "$0" "${args[@]}"
  fi
  echo "$0: no private network here: $refused was refused, so the" \
       "cluster's ports $base_port-$last_port are open to the network (-H" \
       "chooses that without trying; Ubuntu allows the namespace with sysctl" \
       "kernel.apparmor_restrict_unprivileged_userns=0)" >&2
fi
if [[ -n ${LAUNCH_LOCAL_NETNS:-} ]]; then
  ip link set lo up || { echo "$0: error: cannot bring up the namespace's loopback (-H skips the namespace)" >&2; exit 1; }
fi

# The launcher describes the cluster with --ps/--worker; a TF_CONFIG or a
# Slurm task of the surroundings would conflict with that.
unset TF_CONFIG SLURM_STEP_ID
run_dir=${run_dir:-runs/$mode-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$run_dir" || exit 1

host_list() {  # FIRST_PORT COUNT
  local i hosts=()
  for ((i = 0; i < $2; i++)); do hosts+=("localhost:$(($1 + i))"); done
  (IFS=,; echo "${hosts[*]}")
}
ps_hosts=$(host_list "$base_port" "$num_ps")
worker_hosts=$(host_list $((base_port + num_ps)) "$num_workers")

if [[ $mode == compare || $mode == straggler ]]; then
  failed=0 child=''
  # Each run stops its own tasks, in the background, where the trap can
  # act at once, not after the run; it ignores SIGINT there, and takes
  # SIGUSR1 for it: under nohup it could not trap SIGHUP.
  trap 'echo "$0: interrupted, stopping every task" >&2
        [[ -n $child ]] && kill -USR1 "$child" && wait "$child"; exit 130' INT
  trap 'echo "$0: terminated, stopping every task" >&2
        [[ -n $child ]] && kill -TERM "$child" && wait "$child"; exit 143' TERM
  runs=(async sync)
  [[ $mode == straggler ]] && runs+=(backup)
  ((with_tf2)) && runs+=(tf2)
  for run in "${runs[@]}"; do
    m=${run/backup/sync} backup=()
    [[ $run == backup ]] && backup=(--replicas_to_aggregate=$((num_workers - 1)))
    # Already in the namespace, or on the host network by choice: -H.
    "$0" -H -n "$num_workers" -p "$num_ps" -b "$base_port" -o "$run_dir/$run" \
      ${slow_ms:+-s "$slow_ms"} $( ((evaluator)) && printf '%s' -e) "$m" \
      --logdir="$run_dir/$run/logdir" "$@" "${backup[@]}" &
    child=$!
    wait "$child"
    status=$?
    ((status == 130 || status == 143)) && exit $status
    ((status == 0)) || failed=1
  done
  "$python" "$here/launcher/compare.py" "$run_dir" || failed=1
  exit $failed
fi

ps_pids=() worker_pids=() evaluator_pids=()
start_task() {  # JOB INDEX [flags...]
  local job=$1 index=$2
  shift 2
  # The whole output goes to the task's log; its training lines and errors
  # to the terminal too. tee and grep ignore stop_all's signal and end with
  # the task, so that its last line still reaches its log.
  ( "$python" "$here/mnist_dist_$mode.py" --job_name="$job" --task_index="$index" \
      --ps="$ps_hosts" --worker="$worker_hosts" "$@" 2>&1 \
      | (trap '' INT TERM; exec tee "$run_dir/$job$index.log") \
      | (trap '' INT TERM; exec grep --line-buffered -E '^(worker=|evaluator:)|: error: ')
    exit "${PIPESTATUS[0]}" ) &
}

stop_all() {  # SIGNAL, passed on to every task
  local pids=("${ps_pids[@]}" "${worker_pids[@]}" "${evaluator_pids[@]}") pid
  local parents
  parents=$(IFS=,; echo "${pids[*]}")
  # Every task at once, as Ctrl-C in a terminal: one told after another
  # might first hear that another was interrupted, and fail for it.
  pkill -"$1" -P "$parents"
  # After SIGTERM the chief saves the model, and the ps tasks wait for it
  # (--preemption_grace); Kubernetes would wait 30 s too.
  for _ in {1..300}; do
    pgrep -P "$parents" > /dev/null || break
    sleep 0.1
  done
  pkill -KILL -P "$parents"
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null; done
}
trap 'echo "$0: interrupted, stopping every task" >&2; stop_all INT; exit 130' INT HUP USR1
trap 'echo "$0: terminated, stopping every task as a scheduler preempts them" >&2
      stop_all TERM; exit 143' TERM

if ((evaluator)); then
  # The evaluator follows the chief's checkpoints: they need a --logdir.
  [[ " $* " == *" --logdir="* ]] || set -- "$@" --logdir="$run_dir/logdir"
fi
# Elastic: every task is told the fewest workers it may train with.
[[ -n $min_workers ]] && set -- "$@" --min_workers="$min_workers"
echo "$mode: $num_ps ps ($ps_hosts), $num_workers workers ($worker_hosts)$( ((evaluator)) && echo ', an evaluator')$([[ -n $slow_ms ]] && echo ", worker $((num_workers - 1)) $slow_ms ms slower a step")$([[ -n $min_workers ]] && echo ", $min_workers at first, the rest $later s later"), logs in $run_dir"
for ((i = 0; i < num_ps; i++)); do start_task ps "$i" "$@"; ps_pids+=($!); done
started=0 late_at=$((SECONDS + later))
start_workers() {  # UP_TO, FLAGS...: the workers not started yet, below UP_TO
  local up_to=$1
  shift
  for ((; started < up_to; started++)); do
    if ((started == num_workers - 1)); then
      start_task worker "$started" "$@" ${slow_ms:+--step_delay_ms="$slow_ms"}
    else
      start_task worker "$started" "$@"
    fi
    worker_pids+=($!)
  done
}
start_workers "${min_workers:-$num_workers}" "$@"
if ((evaluator)); then start_task evaluator 0 "$@"; evaluator_pids+=($!); fi

why() {  # LOG: the task's own line that says why it ended, indented
  grep -E ': error: |: interrupted$|: every worker has ended|: the coordinator, .* left: ' "$1" |
    tail -n 1 | sed 's/^/    /'
}
killed() {  # STATUS LOG: the signal that killed a task that said nothing
  ((${1} > 128)) && [[ -z $(why "$2") ]] && kill -l $(($1 - 128))
}

# The workers, as each ends. One that a signal killed told nobody: the
# launcher marks it as left on the ps tasks (launcher/tell_ps.py, whose
# TensorFlow chatter goes to the worker's log), which would otherwise wait
# --worker_timeout for it to come back.
failed=0 running=$started
while ((running > 0)); do
  # -m: the rest once it is time, while the chief trains.
  if ((started < num_workers && SECONDS >= late_at)) &&
     ! grep -q '^worker=0, final accuracy' "$run_dir/worker0.log"; then
    running=$((running + num_workers - started))
    start_workers "$num_workers" "$@"
  fi
  for ((i = 0; i < started; i++)); do
    [[ -z ${worker_status[i]:-} ]] || continue
    kill -0 "${worker_pids[i]}" 2>/dev/null && continue
    wait "${worker_pids[i]}"
    worker_status[i]=$? running=$((running - 1))
    ((worker_status[i] == 0)) || failed=1
    worker_signal[i]=$(killed "${worker_status[i]}" "$run_dir/worker$i.log")
    # A TF2 ps does not count workers: its coordinator tells it.
    if [[ -n ${worker_signal[i]} && $mode != tf2 ]]; then
      (trap '' INT; cd "$here" && exec "$python" -m launcher.tell_ps \
        "$ps_hosts" "$worker_hosts" "$i" \
        "killed by SIG${worker_signal[i]}, as $0 saw" \
        >> "$run_dir/worker$i.log" 2>&1)
    fi
  done
  ((running > 0)) && sleep 0.2
done
# The ps tasks leave on their own within a second or so of the last worker;
# a busy machine may take longer.
for _ in {1..600}; do
  kill -0 "${ps_pids[@]}" 2>/dev/null || break
  sleep 0.1
done
for ((i = 0; i < num_ps; i++)); do
  if kill -0 "${ps_pids[i]}" 2>/dev/null; then
    echo "$0: ps $i did not exit after the workers; stopping it" >&2
    pkill -KILL -P "${ps_pids[i]}"
  fi
  wait "${ps_pids[i]}"
  ps_status[i]=$?
  ((ps_status[i] == 0)) || failed=1
done

for pid in "${evaluator_pids[@]}"; do
  wait "$pid"
  evaluator_status=$?
  ((evaluator_status == 0)) || failed=1
done

echo "---- $mode, $num_workers workers, logs in $run_dir"
# A ps that ended after the workers, as it should, goes without saying.
for ((i = 0; i < num_ps; i++)); do
  ended=$(why "$run_dir/ps$i.log")
  if ((ps_status[i] != 0)) || [[ -n $ended ]]; then
    echo "ps $i: exit ${ps_status[i]}"
    [[ -n $ended ]] && echo "$ended"
  fi
done
for ((i = 0; i < num_workers; i++)); do
  if ((i >= started)); then echo "worker $i: not started: the chief ended first"; continue; fi
  accuracy=$(sed -n 's/^worker=[0-9]*, final accuracy = //p' "$run_dir/worker$i.log")
  # The GPU a worker said it got, if any.
  gpu=$(sed -n 's/^\/job:worker\/task:[0-9]*: on \(GPU [0-9]* of [0-9]*\).*/, on \1/p' "$run_dir/worker$i.log")
  if [[ $mode == tf2 ]] && ((i > 0)); then  # it computes the coordinator's steps
    echo "worker $i: exit ${worker_status[i]}$gpu"
    why "$run_dir/worker$i.log"
  else
    echo "worker $i: exit ${worker_status[i]}, final accuracy = ${accuracy:-none}$gpu"
    ((worker_status[i] == 0)) || why "$run_dir/worker$i.log"
  fi
  [[ -n ${worker_signal[i]} ]] && echo "    killed by SIG${worker_signal[i]}"
done
if ((evaluator)) && ((evaluator_status != 0)); then
  echo "evaluator: exit $evaluator_status"
  why "$run_dir/evaluator0.log"
fi
exit $failed
