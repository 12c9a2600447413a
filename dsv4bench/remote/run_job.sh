#!/usr/bin/env bash
# dsv4bench remote job wrapper, uploaded into each job directory as run.sh and always started there.
#
#   bash run.sh run      run the job (under Slurm: one array task). Waits for the GPU lock, then runs
#                        `$PYTHON -m dsv4bench ARGS` in its own session and process group, under
#                        `timeout`, with output in output.log; then clears what is left of that group
#                        and writes `exit` ("RC ELAPSED_S") atomically.
#   bash run.sh cancel   mark every task cancelled; on an ssh host TERM the job's process group, KILL it
#                        after the grace period, and report (never kill) GPU processes that are not its own.
#   bash run.sh state    one line per task: NAME<TAB>STATE<TAB>EXIT<TAB>CANCELLED<TAB>WRAPPER_ALIVE
#
# Every value (argv, env, paths, timeouts) comes from job.env, written by the client with each value
# shell-quoted; nothing here is built by pasting strings into commands.
set -u
JOB_DIR=$PWD
mode=${1:-}
. ./job.env   # sets BACKEND SETUP PYTHON TIMEOUT_S GRACE_S LOCK_FILE SHARDS, exports env, `set --` argv

put() { printf '%s\n' "$2" > "$1.tmp" && mv -f "$1.tmp" "$1"; }   # atomic small-file write
now() { date +%s; }
# Live (non-zombie) members of process group $1.
members() { ps -eo pgid=,pid=,stat= | awk -v g="$1" '$1 == g && $3 !~ /^Z/ { print $2 }'; }
alive() { [ -n "$(members "$1")" ]; }

# TERM the group, wait up to GRACE_S, then KILL it and wait until no live member is left.
reap_group() {
    local pg=$1 deadline
    alive "$pg" || return 0
    kill -TERM -- "-$pg" 2>/dev/null
    deadline=$(( $(now) + ${GRACE_S%.*} ))
    while alive "$pg" && [ "$(now)" -lt "$deadline" ]; do sleep 0.1; done
    if alive "$pg"; then
        echo "process group $pg ignored TERM for ${GRACE_S}s: KILL" >&2
        kill -KILL -- "-$pg" 2>/dev/null
        while alive "$pg"; do sleep 0.1; done
    fi
    # orphaned members are zombies until init reaps them: give it a moment
    for _ in $(seq 50); do kill -0 -- "-$pg" 2>/dev/null || break; sleep 0.1; done
}

# The task directories: the job directory itself, or one task-N per Slurm array task.
tasks=("$JOB_DIR")
if [ "$BACKEND" = slurm ]; then
    shopt -s nullglob
    tasks=("$JOB_DIR"/task-*)
fi

run() {
    local task=$JOB_DIR rc start child stopping=""
    if [ "$BACKEND" = slurm ]; then
        task=$JOB_DIR/task-${SLURM_ARRAY_TASK_ID:-0}
        [ "$SHARDS" -gt 1 ] && set -- "$@" --shard "${SLURM_ARRAY_TASK_ID:-0}/$SHARDS"
    fi
    mkdir -p "$task/out" && cd "$task" || exit 97
    put pid "$$"
    put state queued
    if [ -n "$LOCK_FILE" ]; then
        exec 9>>"$LOCK_FILE"
        flock 9
    fi
    if [ -e cancelled ]; then put exit "130 0"; put state done; return; fi
    put state running
    start=$(now)
    # TERM to the wrapper (Slurm's --signal=B:TERM, a shutdown) stops the job's group, then records.
    # (The job itself starts with default handlers: bash resets caught signals in subshells.)
    trap 'stopping=1' TERM INT HUP
    # setsid: a new session whose id is the job's process group; its leader writes pgid first.
    (cd out && exec setsid -w bash -c '
        printf "%s\n" "$$" > ../pgid.tmp && mv -f ../pgid.tmp ../pgid
        eval "$1" || exit 5
        shift
        exec timeout -k "$1" "$2" "$3" -m dsv4bench "${@:4}"' \
        job "$SETUP" "$GRACE_S" "$TIMEOUT_S" "$PYTHON" "$@") </dev/null >>output.log 2>&1 &
    child=$!
    wait "$child"
    rc=$?
    if [ -n "$stopping" ]; then
        while [ ! -f pgid ] && kill -0 "$child" 2>/dev/null; do sleep 0.1; done
        [ -f pgid ] && reap_group "$(cat pgid)" 2>>output.log
        wait "$child"
        rc=$?
    fi
    [ -f pgid ] && reap_group "$(cat pgid)" 2>>output.log
    put exit "$rc $(( $(now) - start ))"
    put state done
}

gpu_processes() {
    command -v nvidia-smi >/dev/null || return 0
    nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader 2>/dev/null
}

cancel() {
    local task pg="" line pid ours
    for task in "${tasks[@]}"; do
        : > "$task/cancelled"
    done
    [ "$BACKEND" = slurm ] && return 0   # scancel stops the tasks on their nodes
    task=$JOB_DIR
    if [ ! -f "$task/pgid" ] && [ -f "$task/pid" ] && [ ! -f "$task/exit" ]; then
        kill -TERM -- "-$(cat "$task/pid")" 2>/dev/null   # still queued on the lock (its own group)
        sleep 0.2
    fi
    if [ -f "$task/pgid" ]; then
        pg=$(cat "$task/pgid")
        echo "stopping process group $pg"
        reap_group "$pg" 2>&1
        while [ ! -f "$task/exit" ] && kill -0 "$(cat "$task/pid")" 2>/dev/null; do sleep 0.1; done
    fi
    [ -f "$task/exit" ] || { put "$task/exit" "130 0"; put "$task/state" done; }
    gpu_processes | while IFS=, read -r pid line; do
        ours=$(ps -o pgid= -p "$pid" 2>/dev/null | tr -d ' ')
        [ -n "$pg" ] && [ "$ours" = "$pg" ] && continue
        echo "GPU process not of this job, left running: pid $pid,$line"
    done
}

state() {
    local task alive
    for task in "${tasks[@]}"; do
        alive=0
        [ -f "$task/pid" ] && kill -0 "$(cat "$task/pid")" 2>/dev/null && alive=1
        printf '%s\t%s\t%s\t%s\t%s\n' "$(basename "$task")" "$(cat "$task/state" 2>/dev/null || echo new)" \
            "$(cat "$task/exit" 2>/dev/null || echo -)" "$([ -e "$task/cancelled" ] && echo 1 || echo 0)" "$alive"
    done
}

case $mode in
    run) run "$@" ;;
    cancel) eval "$SETUP" >/dev/null 2>&1; cancel ;;
    state) state ;;
    *) echo "usage: bash run.sh run|cancel|state" >&2; exit 2 ;;
esac
