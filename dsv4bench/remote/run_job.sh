#!/usr/bin/env bash
# dsv4bench remote job wrapper, uploaded into each job directory as run.sh and always started there.
#
#   bash run.sh run      run the job (under Slurm: one array task). Waits for the GPU lock, then runs
#                        `$PYTHON -m dsv4bench ARGS` in a session of its own (its leader's pid is the
#                        session and process group id), under `timeout`, with output in output.log;
#                        then stops what is left of that session and records `exit` ("RC ELAPSED_S").
#   bash run.sh cancel   unless the job has finished: mark it cancelled, TERM its process group and
#                        session, KILL them after the grace period; report (never kill) GPU processes
#                        that are not its own. A finished job's outcome is never rewritten.
#   bash run.sh state    one line per task: NAME<TAB>STATE<TAB>EXIT<TAB>CANCELLED<TAB>WRAPPER_ALIVE
#
# Processes are known by pid *and* start time (pids are reused): `pid` (the wrapper) and `pgid` (the
# job's session leader) each have a `.stime` beside them. `exit` and the `cancelled` marker are written
# under the task's finish.lock, so a cancel either comes before the outcome or finds it recorded.
#
# Every value (argv, env, paths, timeouts) comes from job.env, written by the client with each value
# shell-quoted; nothing here is built by pasting strings into commands.
set -u
JOB_DIR=$PWD
mode=${1:-}
. ./job.env   # sets BACKEND SETUP PYTHON TIMEOUT_S GRACE_S LOCK_FILE SHARDS, exports env, `set --` argv

put() { printf '%s\n' "$2" > "$1.tmp" && mv -f "$1.tmp" "$1"; }   # atomic small-file write
now() { date +%s; }

# Start time of process $1 in clock ticks since boot: field 22 of /proc/PID/stat, counted after the
# command name (which may hold spaces and parentheses). Empty when there is no such process.
stime() {
    local s
    read -r s 2>/dev/null < "/proc/$1/stat" || return 0
    set -- ${s##*) }   # unquoted on purpose: split the numeric fields, from field 3 on
    printf '%s\n' "${20:-}"
}
# Record process $2 in file $1 and its start time in $1.stime (written first: $1 implies both).
note() { put "$1.stime" "$(stime "$2")" && put "$1" "$2"; }
exists() { kill -0 "$1" 2>/dev/null || [ -d "/proc/$1" ]; }
# Whether the process recorded in file $1 still runs: that pid, with the recorded start time.
running() {
    local pid
    pid=$(cat "$1" 2>/dev/null) && [ -n "$pid" ] && exists "$pid" &&
        [ "$(stime "$pid")" = "$(cat "$1.stime" 2>/dev/null)" ]
}

# The job's session id (= its process group id = its leader's pid) in task directory $1, while the task
# has not recorded its outcome and the id is still the job's: a live leader must have the recorded start
# time; after the leader, whatever holds the id is the job's (no id is reused while a process holds it).
job_session() {
    local j
    [ ! -f "$1/exit" ] && j=$(cat "$1/pgid" 2>/dev/null) && [ -n "$j" ] || return 1
    if exists "$j" && ! running "$1/pgid"; then return 1; fi
    printf '%s\n' "$j"
}
# Live (non-zombie) processes of the job: its process group $1 and anything else in its session $1
# (a sweep's workers may run in process groups of their own).
members() { ps -eo sid=,pgid=,pid=,stat= | awk -v j="$1" '($1 == j || $2 == j) && $4 !~ /^Z/ { print $3 }'; }
alive() { [ -n "$(members "$1")" ]; }
# Signal $1 to the job's process group $2 and to every member of its session (split on purpose).
signal() { kill "-$1" -- "-$2" $(members "$2") 2>/dev/null; }

# TERM the job (group and session $1), wait up to GRACE_S, then KILL until no live member is left.
reap() {
    local j=$1 deadline
    alive "$j" || return 0
    signal TERM "$j"
    deadline=$(( $(now) + ${GRACE_S%.*} ))
    while alive "$j" && [ "$(now)" -lt "$deadline" ]; do sleep 0.1; done
    if alive "$j"; then
        echo "the job's processes (session $j) ignored TERM for ${GRACE_S}s: KILL" >&2
        while alive "$j"; do signal KILL "$j"; sleep 0.1; done
    fi
    # orphaned members are zombies until init reaps them: give it a moment
    for _ in $(seq 50); do kill -0 -- "-$j" 2>/dev/null || break; sleep 0.1; done
}

# Under the task's lock: record the outcome "RC SECONDS" of task directory $1, unless it has one.
finish() { ( flock 8; [ -f "$1/exit" ] || put "$1/exit" "$2"; put "$1/state" done ) 8>>"$1/finish.lock"; }
# Under the same lock: mark the task cancelled; fails, marking nothing, once it has an outcome.
claim() { ( flock 8; [ ! -f "$1/exit" ] && : > "$1/cancelled" ) 8>>"$1/finish.lock"; }

# The task directories: the job directory itself, or one task-N per Slurm array task.
tasks=("$JOB_DIR")
if [ "$BACKEND" = slurm ]; then
    shopt -s nullglob
    tasks=("$JOB_DIR"/task-*)
fi

stop_job() { local j; j=$(job_session "$1") && reap "$j" 2>>"$1/output.log"; }

run() {
    local task=$JOB_DIR rc start child stopping=""
    if [ "$BACKEND" = slurm ]; then
        task=$JOB_DIR/task-${SLURM_ARRAY_TASK_ID:-0}
        [ "$SHARDS" -gt 1 ] && set -- "$@" --shard "${SLURM_ARRAY_TASK_ID:-0}/$SHARDS"
    fi
    mkdir -p "$task/out" && cd "$task" || exit 97
    note pid "$$"
    put state queued
    if [ -n "$LOCK_FILE" ]; then
        exec 9>>"$LOCK_FILE"
        flock 9
    fi
    if [ -e cancelled ]; then finish "$task" "130 0"; return; fi
    put state running
    start=$(now)
    # TERM to the wrapper (Slurm's --signal=B:TERM, a shutdown) stops the job's session, then records.
    # (The job itself starts with default handlers: bash resets caught signals in subshells.)
    trap 'stopping=1' TERM INT HUP
    # setsid: a new session whose id is the job's process group; its leader records itself first
    # (with the helpers exported to it, and unset before anything of the job runs).
    (cd out && export -f put stime note && exec setsid -w bash -c '
        note ../pgid "$$"
        unset -f put stime note
        eval "$1" || exit 5
        shift
        exec timeout -k "$1" "$2" "$3" -m dsv4bench "${@:4}"' \
        job "$SETUP" "$GRACE_S" "$TIMEOUT_S" "$PYTHON" "$@") </dev/null >>output.log 2>&1 &
    child=$!
    wait "$child"
    rc=$?
    if [ -n "$stopping" ]; then
        while [ ! -f pgid ] && kill -0 "$child" 2>/dev/null; do sleep 0.1; done
        stop_job "$task"
        wait "$child"
        rc=$?
    fi
    stop_job "$task"   # what outlived the command: its workers, daemons it forked
    finish "$task" "$rc $(( $(now) - start ))"
}

gpu_processes() {
    command -v nvidia-smi >/dev/null || return 0
    nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader 2>/dev/null
}

# GPU compute processes outside the job's session $1 (if any): reported, never signalled.
report_gpu_processes() {
    local pid line
    gpu_processes | while IFS=, read -r pid line; do
        [ -n "$1" ] && [ "$(ps -o sid= -p "$pid" 2>/dev/null | tr -d ' ')" = "$1" ] && continue
        echo "GPU process not of this job, left running: pid $pid,$line"
    done
}

cancel_task() {
    local task=$1 j stopped=""
    if ! claim "$task"; then
        echo "job already finished (exit $(cat "$task/exit")): not cancelled"
        return 0
    fi
    if [ ! -f "$task/pgid" ] && running "$task/pid"; then   # queued on the GPU lock (its own group)
        kill -TERM -- "-$(cat "$task/pid")" 2>/dev/null && stopped=1
        sleep 0.2
    fi
    j=$(job_session "$task") || j=""
    if [ -n "$j" ] && alive "$j"; then
        echo "stopping the job's process group and session $j"
        reap "$j" 2>&1
        stopped=1
    fi
    while [ ! -f "$task/exit" ] && running "$task/pid"; do sleep 0.1; done   # its wrapper records the outcome
    [ -z "$stopped" ] || finish "$task" "130 0"   # ... unless that wrapper is gone too
    report_gpu_processes "$j"
}

cancel() {
    local task
    if [ "$BACKEND" = slurm ]; then   # scancel stops the tasks on their nodes
        for task in "${tasks[@]}"; do
            claim "$task" || echo "$(basename "$task") already finished (exit $(cat "$task/exit")): not cancelled"
        done
        return 0
    fi
    cancel_task "$JOB_DIR"
}

state() {
    local task alive
    for task in "${tasks[@]}"; do
        alive=0
        running "$task/pid" && alive=1
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
