"""The runs of a sweep or suite as Slurm jobs (sweep.py --launcher=slurm), where every run stands
(sweep.py --status) and the progress line both launchers print.

One submission is one job array: one task per run that is neither finished nor queued/running, at
most slurm_max_running at once. Each task runs slurm/train_job.sh, the multi-node example's job
body: resume from out_dir, `srun torchrun` for several ranks, requeue itself when Slurm's signal
before the time limit (or a preemption) made train.py checkpoint and stop. A run directory records
its latest job in slurm.json; a dependent job runs `sweep.py ... --status`, which builds the report
once every run has finished.

Plain sbatch rather than submitit: submitit runs a pickled Python function inside the job and reads
job states from sacct, which many clusters (and the test cluster) lack; here the job is a shell
script anyone can read and resubmit, and the run directories, not the scheduler, say what finished.
"""
import json
import os
import shlex
import shutil
import subprocess
import sys
import time

import configurator
import rundir
import runtime
from ablation import suites

RECORD = "slurm.json"  # in a run directory: its latest job id, log and script
QUEUED = {"PENDING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESV_DEL_HOLD", "SPECIAL_EXIT"}
RUNNING = {"CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT", "RESIZING"}
DONE = ("finished", "diverged")  # a diverged run would only diverge again: it is reported, not rerun
NO_SLURM = "start one (on a test machine: bash slurm/start_test_cluster.sh; docs/slurm.md)"


def resources(options, declared, nproc, defaults):
    """Each run's resources: the suite's `slurm` dict (keys without the slurm_ prefix), and every
    --slurm_* flag given on the command line over it; `defaults` are sweep.py's OPTIONS."""
    names = {key.removeprefix("slurm_"): key for key in defaults if key.startswith("slurm_")}
    unknown = set(declared) - set(names)
    if unknown:
        raise configurator.ConfigError(f"slurm={{...}} sets unknown keys {sorted(unknown)}: use {sorted(names)}")
    res = {name: defaults[key] for name, key in names.items()}
    for name, value in declared.items():
        res[name] = configurator.check_type(names[name], value, defaults[names[name]], f"slurm[{name!r}]")
    res.update({name: options[key] for name, key in names.items() if options[key] != defaults[key]})
    for name in ("nodes", "gpus_per_node", "cpus_per_task", "max_running", "signal_s"):
        if res[name] < (1 if name == "nodes" else 0):
            raise configurator.ConfigError(f"slurm_{name}={res[name]}: a count, >= {1 if name == 'nodes' else 0}")
    if nproc % res["nodes"]:
        raise configurator.ConfigError(f"slurm_nodes={res['nodes']} does not divide the run's {nproc} ranks (nproc)")
    return res


def array_script(todo, sweep_dir, res, nproc, job_name):
    """The sbatch script of one submission: task i runs todo[i] (name, train.py argv)."""
    per_node = nproc // res["nodes"]
    cpus = res["cpus_per_task"] or per_node
    logs = os.path.abspath(os.path.join(sweep_dir, "slurm"))
    sbatch = [f"--job-name={job_name}",
              f"--array=0-{len(todo) - 1}" + (f"%{res['max_running']}" if res["max_running"] else ""),
              f"--nodes={res['nodes']}", "--ntasks-per-node=1", f"--cpus-per-task={cpus}",
              *([f"--gpus-per-node={res['gpus_per_node']}"] if res["gpus_per_node"] else []),
              *(f"--{key}={res[key]}" for key in ("partition", "time", "account", "qos") if res[key]),
              f"--signal=TERM@{res['signal_s']}", "--requeue",
              "--open-mode=append",  # a requeued task appends to the same log
              f"--output={logs}/%A_%a.out", f"--chdir={os.getcwd()}",
              *(line.strip() for line in res["sbatch"].split(";") if line.strip())]
    lines = ["#!/bin/bash", f"# Written by sweep.py --launcher=slurm: one array task per run of {sweep_dir} "
             "still to do (docs/slurm.md).", *(f"#SBATCH {option}" for option in sbatch), "",
             f"export NPROC_PER_NODE={per_node} PYTHON={shlex.quote(sys.executable)} "
             f"OMP_NUM_THREADS={max(1, cpus // per_node)}",
             'case "$SLURM_ARRAY_TASK_ID" in']
    lines += [f"    {i}) RUN=({shlex.join(argv)}) ;;  # {name}" for i, (name, argv) in enumerate(todo)]
    lines += ["esac", f'exec bash {shlex.quote(os.path.join(runtime.REPO_DIR, "slurm", "train_job.sh"))} "${{RUN[@]}}"']
    return "\n".join(lines) + "\n"


def sbatch(args):
    """Submit; returns the job id. A refusal (a bad partition, time or option) is one line."""
    if not shutil.which("sbatch"):
        raise configurator.ConfigError(f"--launcher=slurm: no sbatch on this machine: run on a Slurm login node, or "
                                       f"{NO_SLURM}")
    done = subprocess.run(["sbatch", "--parsable", *args], capture_output=True, text=True)
    if done.returncode:
        raise configurator.ConfigError(f"sbatch refused the jobs: {done.stderr.strip().splitlines()[-1]}")
    return done.stdout.strip().split(";")[0]


def submit(runs, sweep_dir, nproc, res, status_command):
    """Submit the runs that are neither finished nor queued/running (resubmitting is idempotent);
    returns the names submitted. A fork suite's branches (sweep.fork_plan) go in one array per trunk
    that starts when the trunk's job has ended (afterany: a branch of a trunk that failed stops in its
    first line, naming the trunk, rather than waiting forever)."""
    todo, live = [], {}
    for (name, point, argv), run in zip(runs, run_states(runs, sweep_dir)):
        if run["state"] in (*DONE, "queued", "running"):
            print(f"skip {name}: {run['state']}" + (f" (job {run['job']})" if run["job"] else ""))
            live[name] = run["job"] if run["state"] in ("queued", "running") else ""
        else:
            todo.append((name, point.get("after"), argv))
    if not todo:
        print("nothing to submit: every run is finished, queued or running (sweep.py ... --status shows them)")
        return []
    logs = os.path.join(sweep_dir, "slurm")
    os.makedirs(logs, exist_ok=True)
    job_name = os.path.basename(os.path.normpath(sweep_dir)).removeprefix("out-")
    waves = {}  # the trunk a wave of runs waits for (None: none); trunks come first in a fork suite's runs
    for name, trunk, argv in todo:
        waves.setdefault(trunk, []).append((name, argv))
    stamp, arrays = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}", []
    for k, (trunk, wave) in enumerate(sorted(waves.items(), key=lambda item: item[0] is not None)):
        waits_for = live.get(trunk, "") if trunk else ""
        script = os.path.abspath(os.path.join(logs, f"array-{stamp}{'-%d' % k if k else ''}.sbatch"))
        with rundir.atomic_write(script, "w") as f:
            f.write(array_script(wave, sweep_dir, res, nproc, job_name))
        try:
            array = sbatch([*([f"--dependency=afterany:{waits_for}"] if waits_for else []), script])
        except configurator.ConfigError:
            os.remove(script)
            if arrays:  # the arrays already in the queue run; submitting again submits the rest
                print(f"submitted only job arrays {', '.join(arrays)}: the rest was refused")
            raise
        arrays.append(array)
        for i, (name, _) in enumerate(wave):
            os.makedirs(os.path.join(sweep_dir, name), exist_ok=True)
            with rundir.atomic_write(os.path.join(sweep_dir, name, RECORD), "w") as f:
                json.dump(dict(job=f"{array}_{i}", log=os.path.join(os.path.abspath(logs), f"{array}_{i}.out"),
                               script=script, submitted=time.time()), f)
            live[name] = f"{array}_{i}"
        print(f"submitted {len(wave)} runs as job array {array} ({script})" +
              (f", to start when {trunk} (job {waits_for}) has ended" if waits_for else ""))
    # Each run's record was written as soon as its array was queued, so a refused status job loses none.
    status_job = sbatch([f"--dependency=afterany:{':'.join(arrays)}", "--job-name=status", f"--chdir={os.getcwd()}",
                         f"--output={os.path.abspath(logs)}/status-%j.out", f"--wrap={shlex.join(status_command)}"])
    for name, _, _ in todo:
        path = os.path.join(sweep_dir, name, RECORD)
        with rundir.atomic_write(path, "w") as f:
            json.dump(dict(read_record(os.path.join(sweep_dir, name)), status_job=status_job), f)
    print(f"job {status_job} builds the report when they end; `sweep.py ... --status` shows where they stand")
    return [name for name, _, _ in todo]


def squeue():
    """{job id: Slurm state} of the jobs Slurm still knows, one line per array task."""
    if not shutil.which("squeue"):
        raise configurator.ConfigError(f"runs were submitted to Slurm but squeue is missing here: {NO_SLURM}")
    done = subprocess.run(["squeue", "-h", "-r", "-o", "%i %T"], capture_output=True, text=True)
    if done.returncode:
        raise configurator.ConfigError(f"squeue failed ({done.stderr.strip()[-200:]}): is the cluster up? {NO_SLURM}")
    return dict(line.split() for line in done.stdout.splitlines() if line.strip())


def out_dir_busy(out_dir):
    """Whether the process that last locked out_dir (rundir.out_dir_lock writes its pid) is alive on
    this machine. Asked only of runs never submitted to Slurm: a local train.py or sweep may hold
    them. (Taking the lock to test it could make a train.py starting at that moment refuse.)"""
    try:
        pid = int(open(os.path.join(out_dir, rundir.LOCK_FILE)).read().strip())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return False
    return pid != os.getpid()


def read_record(out_dir):
    try:
        return json.load(open(os.path.join(out_dir, RECORD)))
    except (OSError, ValueError):
        return {}


def run_states(runs, sweep_dir):
    """Per run: name, state (finished, diverged, queued, running, preempted, failed or not run),
    Slurm job id and log ('' when run locally), a note on a queued run that ran before, from the
    run directory and squeue."""
    records = {name: read_record(os.path.join(sweep_dir, name)) for name, _, _ in runs}
    live = squeue() if any(records.values()) else {}
    states = []
    for name, _, _ in runs:
        out_dir, record = os.path.join(sweep_dir, name), records[name]
        events = rundir.read_events(out_dir)
        logged = rundir.run_status(events)
        job = record.get("job", "")
        if logged in DONE:
            state = logged
        elif live.get(job) in QUEUED:
            state = "queued"
        elif live.get(job) in RUNNING or not job and out_dir_busy(out_dir):
            state = "running"
        elif logged == "not run" and job:
            state = "failed"  # its job ended before train.py wrote a record
        else:
            state = logged
        note = ""
        if state == "queued" and logged == "preempted":  # its job stopped after this submission: Slurm requeued it
            stopped = [e["time"] for e in events if e["event"] == "end"][-1]
            note = "requeued after a preemption" if stopped > record.get("submitted", 0) else \
                "submitted again: resumes from its checkpoint"
        log = record.get("log") or os.path.join(out_dir, "console.txt")
        states.append(dict(name=name, state=state, logged=logged, job=job, log=log if os.path.exists(log) else "",
                           note=note))
    return states


def run_duration(events):
    """Seconds a run spent running: from each start (its checklist) to the `end` that followed, so
    the time a requeued run waited in the queue does not count."""
    total, start = 0.0, None
    for event in events:
        if event["event"] == "checklist":
            start = event["time"]
        elif event["event"] == "end" and start is not None:
            total, start = total + event["time"] - start, None
    return total


def progress_line(out_dirs, running, queued, parallel):
    """'3/8 runs done, 2 running, 3 queued; about 12 min left' from the finished runs' durations,
    the unfinished runs sharing `parallel` slots. `running` and `queued` are out_dirs too: a run whose
    log says it finished counts as done even while its process is still exiting."""
    logs = {out_dir: rundir.read_events(out_dir) for out_dir in out_dirs}
    finished = [events for events in logs.values() if rundir.run_status(events) in DONE]
    running, queued = (sum(rundir.run_status(logs[d]) not in DONE for d in dirs) for dirs in (running, queued))
    stopped = len(out_dirs) - len(finished) - running - queued
    line = f"{len(finished)}/{len(out_dirs)} runs done, {running} running, {queued} queued"
    if stopped:
        line += f", {stopped} stopped (failed, preempted or not run: submit again to resume them)"
    # a local sweep's launch log times each process whole; a log alone misses the start-up before its
    # checklist, most of a short run (25 s runs were said to have 3 s left)
    where = os.path.commonpath(out_dirs) if len(out_dirs) > 1 else ""
    launched = suites.launched_seconds(os.path.join(where, suites.LAUNCHES)) if where else {}
    durations = [launched.get(os.path.relpath(d, where), run_duration(events)) for d, events in logs.items()
                 if rundir.run_status(events) in DONE]
    if durations and len(finished) < len(out_dirs):
        left = sum(durations) / len(durations) * (len(out_dirs) - len(finished)) / max(1, parallel)
        line += f"; about {duration_text(left)} left"
        line += f" (mean of {len(durations)} finished runs, {max(1, parallel)} at a time)"
    return line


def duration_text(seconds):
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min" if seconds < 7200 else \
        f"{seconds / 3600:.1f} h"


def status_text(states, sweep_dir):
    """The status table, each failed run's log tail, and the progress line."""
    width = max(len(s["name"]) for s in states)
    lines = [f"{'run':<{width}}  {'state':<9}  {'job':<10}  log"]
    for s in states:
        note = f" ({s['note']})" if s["note"] else ""
        lines.append(f"{s['name']:<{width}}  {s['state']:<9}  {s['job'] or '-':<10}  {s['log'] or '-'}{note}")
    for s in states:
        if s["state"] == "failed" and s["log"]:
            tail = [line for line in open(s["log"], errors="replace").read().splitlines() if line.strip()][-5:]
            lines.append(f"{s['name']} failed; the end of {s['log']}:")
            lines += [f"    {line}" for line in tail]
    dirs = lambda state: [os.path.join(sweep_dir, s["name"]) for s in states if s["state"] == state or not state]
    lines.append(progress_line(dirs(None), dirs("running"), dirs("queued"), len(dirs("running"))))
    return "\n".join(lines)
