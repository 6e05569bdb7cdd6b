#!/bin/bash
# One train.py run as the body of a Slurm batch job, preemptible: slurm/train_multinode.sbatch and
# the job arrays of `sweep.py --launcher=slurm` end with
#
#   exec bash slurm/train_job.sh TRAIN_ARGS...        # TRAIN_ARGS include --out_dir=DIR
#
# NPROC_PER_NODE ranks per node (default 1), PYTHON (default python), PORT (torchrun's rendezvous
# port on the first node; default one per job, so two jobs sharing a node do not collide).
#
# The run resumes whenever out_dir holds a checkpoint (ckpt.pt or dcp/latest: a requeued or
# resubmitted job). Slurm's signal before the time limit (--signal=TERM@N) or a preemption reaches
# every process of the job step (python, or each rank under one torchrun per node);
# train.py finishes the step, writes a checkpoint, logs an `end` event with stop_reason "signal"
# and exits 3. Then this script requeues the job, which starts again from that checkpoint (unless
# the job was cancelled).
set -u
PYTHON=${PYTHON:-python}
NPROC_PER_NODE=${NPROC_PER_NODE:-1}
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT_DIR=
for arg in "$@"; do
    case "$arg" in --out_dir=*) OUT_DIR=${arg#--out_dir=} ;; esac
done
if [ -z "$OUT_DIR" ]; then
    echo "error: slurm/train_job.sh needs --out_dir=DIR among train.py's arguments (it resumes from there)" >&2
    exit 2
fi

# rundir.checkpoint_path is the one function that knows where a run's checkpoint lives (no torch import:
# this runs at every job start).
RESUME=()
if [ -n "$(cd "$REPO" && "$PYTHON" -c 'import os, sys, rundir
print(rundir.checkpoint_path(os.path.join(sys.argv[1], sys.argv[2])) or "")' "$PWD" "$OUT_DIR")" ]; then
    RESUME=(--init_from=resume)
    echo "resuming $OUT_DIR from its checkpoint (job ${SLURM_JOB_ID:-?}, restart ${SLURM_RESTART_COUNT:-0})"
fi

if [ "$((SLURM_NNODES * NPROC_PER_NODE))" -gt 1 ]; then
    HEAD_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
    PORT=${PORT:-$((20000 + SLURM_JOB_ID % 20000))}
    # Slurm signals every process of the job step, torchrun's ranks included. If torchrun passed
    # SIGTERM on as well, each rank would get it twice, and a second SIGTERM stops train.py at once,
    # without a checkpoint: torchrun ignores it (and installs no handler of its own for it).
    LAUNCH=(bash -c 'trap "" TERM; exec "$@"' torchrun
            "$PYTHON" -m torch.distributed.run --signals_to_handle=SIGINT,SIGHUP,SIGQUIT
            --nnodes="$SLURM_NNODES" --nproc_per_node="$NPROC_PER_NODE"
            --rdzv_id="$SLURM_JOB_ID" --rdzv_backend=c10d --rdzv_endpoint="$HEAD_NODE:$PORT")
else
    LAUNCH=("$PYTHON")
fi
# One task per node: torchrun starts the node's ranks.
srun --kill-on-bad-exit=0 --ntasks-per-node=1 --ntasks="$SLURM_NNODES" \
    "${LAUNCH[@]}" "$REPO/train.py" "$@" "${RESUME[@]}" &
SRUN_PID=$!

# A preemption signals this shell too: keep waiting for the ranks' checkpoint instead of dying.
# (A handler, not `trap '' TERM`: an ignored signal would be inherited by srun and torchrun.)
trap 'echo "SIGTERM: waiting for the ranks to write their checkpoint"' TERM
while true; do
    wait "$SRUN_PID"
    STATUS=$?
    kill -0 "$SRUN_PID" 2>/dev/null || break  # wait returned for srun's exit, not for the trap
done

# Requeue only when this attempt itself stopped for a signal: the log's last record is that `end`
# (an earlier preemption's `end` followed by a crash must not requeue forever).
STOP_REASON=$(cd "$REPO" && "$PYTHON" -c 'import os, sys, rundir
events = rundir.read_events(os.path.join(sys.argv[1], sys.argv[2]))
print(events[-1].get("stop_reason") if events and events[-1]["event"] == "end" else "none")' "$PWD" "$OUT_DIR")
# A job that is still RUNNING was signalled ahead of its time limit (or by scancel --signal): requeue
# it. One that is already COMPLETING was cancelled or preempted (Slurm requeues a preempted one itself
# where the cluster says so): it is not requeued here, and submitting it again resumes it.
# An array task is asked about and requeued by its own id A_i: the task that runs under the array's
# id A would otherwise see every task of the array in squeue, and `scontrol requeue A` requeues them all.
JOB=${SLURM_ARRAY_JOB_ID:+${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}}
JOB=${JOB:-$SLURM_JOB_ID}
JOB_STATE=$(squeue -h -j "$JOB" -o %T 2>/dev/null)
if [ "$STOP_REASON" = "signal" ] && [ "$JOB_STATE" = RUNNING ]; then
    echo "stopped by a signal after a checkpoint; requeueing job $JOB to resume from $OUT_DIR"
    scontrol requeue "$JOB"
    exit 0
fi
if [ "$STOP_REASON" = "signal" ]; then
    echo "stopped by a signal after a checkpoint; job $JOB is ${JOB_STATE:-gone} (cancelled or preempted):" \
         "not requeued; submit it again to resume from $OUT_DIR"
    exit 0
fi
if [ "$STATUS" = 0 ]; then
    echo "finished: stop_reason $STOP_REASON"
else
    KILLED=$([ "$STATUS" -gt 128 ] && echo " (killed by signal $((STATUS - 128)))")
    ENDED=$([ "$STOP_REASON" = none ] && echo "without logging its end" || echo "after its end (stop_reason $STOP_REASON)")
    echo "failed: train.py exited with status $STATUS$KILLED $ENDED (see above); submitting it again resumes" \
         "from its last checkpoint in $OUT_DIR"
fi
exit "$STATUS"
