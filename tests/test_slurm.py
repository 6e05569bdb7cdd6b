"""Suites and runs on a real Slurm cluster (slurm/start_test_cluster.sh: this machine as one node):
sweep.py --launcher=slurm reports as the local launcher does, a signalled job checkpoints, requeues
itself and continues exactly (one rank and, through slurm/train_multinode.sbatch, two ranks under
srun torchrun with HSDP's sharded checkpoints), a cancelled job shows in --status and resumes when
submitted again; resubmitting never submits a live run twice; the progress line's estimate."""
import json
import os
import re
import shutil
import signal
import subprocess

import pytest

import configurator
import rundir
from slurm import jobs as slurm_jobs
import sweep
from helpers import LR, SET_UP, fork_suite, in_process, suite_args, tiny_args, toy_args, wait_for, write_suite

pytestmark = pytest.mark.xdist_group("slurm")  # one test cluster: its jobs must not meet another test's

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Long enough (a few seconds) for a signal to land mid-run; dropout makes the RNG part of the resume.
ITERS, CHECKPOINT_EVERY = 300, 100
LONG = (f"--max_iters={ITERS}", f"--lr_decay_iters={ITERS}", f"--eval_interval={CHECKPOINT_EVERY}", "--dropout=0.1")


def submitted(sweep_dir, jobs):
    """The sweep's job ids (array tasks and the status job), recorded for cleaning up."""
    records = [r for r in (slurm_jobs.read_record(os.path.join(sweep_dir, name)) for name in os.listdir(sweep_dir)) if r]
    ids = {r["job"] for r in records} | {r["status_job"] for r in records}
    jobs.extend(ids)
    return records


def live(job):
    return job in slurm_jobs.squeue()


def row(status, name):
    """A run's line of `sweep.py --status`: name, state, job, log."""
    return next(line.split()[:4] for line in status.splitlines() if line.startswith(name + " "))


def losses(out_dir):
    return {e["iter"]: e["loss"] for e in rundir.read_events(out_dir) if e["event"] == "train"}


def verdicts_and_values(report):
    """What a report concludes and the numbers it concludes from (not timings or paths)."""
    keys = ("n", "mean", "differences", "diff_mean", "interval", "p_value", "p_holm", "verdict", "why")
    return {name: ({k: entry.get(k) for k in keys}, {seed: run["value"] for seed, run in entry["runs"].items()})
            for name, entry in report["variants"].items()}


def test_a_suite_on_slurm_reports_as_run_locally_and_resubmitting_submits_nothing_live(
        cluster, jobs, data_dir, tmp_path, capsys):
    variants = {"base": LR, "lr_low": {"learning_rate": 3e-4, "min_lr": 3e-5}}
    path, _ = write_suite(tmp_path, variants, ["learning_rate", "min_lr"], seeds=(1, 2))
    args = suite_args(data_dir, path)
    local, on_slurm = str(tmp_path / "local"), str(tmp_path / "slurm")
    sweep.main([*args, f"--sweep_dir={local}"], launch=in_process([]))
    assert "4/4 runs done, 0 running, 0 queued" in capsys.readouterr().out  # the local launcher's progress

    slurm_args = [*args, f"--sweep_dir={on_slurm}", "--launcher=slurm", "--slurm_max_running=2"]
    sweep.main(slurm_args)
    records = submitted(on_slurm, jobs)
    assert len(records) == 4 and len({r["job"].split("_")[0] for r in records}) == 1  # one job array
    script = open(records[0]["script"]).read()
    assert "#SBATCH --array=0-3%2" in script and "#SBATCH --signal=TERM@300" in script and "--requeue" in script
    # Again at once: every run is queued or running, nothing is submitted.
    capsys.readouterr()
    sweep.main(slurm_args)
    out = capsys.readouterr().out
    assert "nothing to submit" in out and out.count("skip ") == 4
    assert len([f for f in os.listdir(os.path.join(on_slurm, "slurm")) if f.endswith(".sbatch")]) == 1

    # The dependent status job builds the report once every run has ended.
    wait_for(lambda: os.path.exists(os.path.join(on_slurm, "report.json")), "the status job's report")
    assert verdicts_and_values(json.load(open(os.path.join(on_slurm, "report.json")))) == \
        verdicts_and_values(json.load(open(os.path.join(local, "report.json"))))
    capsys.readouterr()
    sweep.main([*slurm_args, "--status=True"])
    out = capsys.readouterr().out
    for name in ("base-seed1", "base-seed2", "lr_low-seed1", "lr_low-seed2"):
        record = slurm_jobs.read_record(os.path.join(on_slurm, name))
        assert row(out, name) == [name, "finished", record["job"], record["log"]]
    assert "4/4 runs done, 0 running, 0 queued" in out and "every run has finished" in out
    sweep.main(slurm_args)
    assert "nothing to submit" in capsys.readouterr().out


@pytest.fixture(scope="module")
def uninterrupted(data_dir, tmp_path_factory):
    """The one-run grid of the signal tests, run locally without a stop."""
    sweep_dir = str(tmp_path_factory.mktemp("reference"))
    sweep.main([*grid_args(data_dir), f"--sweep_dir={sweep_dir}"], launch=in_process([]))
    return losses(os.path.join(sweep_dir, RUN))


RUN = "learning_rate-0.003"


def grid_args(data_dir):
    return ["--grid=learning_rate=[3e-3]", *toy_args(data_dir, *LONG)]


def start_on_slurm(data_dir, sweep_dir, jobs, steps):
    sweep.main([*grid_args(data_dir), f"--sweep_dir={sweep_dir}", "--launcher=slurm"])
    job = submitted(sweep_dir, jobs)[0]["job"]
    out_dir = os.path.join(sweep_dir, RUN)
    wait_for(lambda: len(losses(out_dir)) >= steps, f"the job's first {steps} steps")
    return job, out_dir


def test_a_signalled_job_checkpoints_requeues_and_continues_exactly(cluster, jobs, data_dir, tmp_path, uninterrupted):
    sweep_dir = str(tmp_path / "s")
    job, out_dir = start_on_slurm(data_dir, sweep_dir, jobs, steps=20)
    subprocess.run(["scancel", "--signal=TERM", job], check=True)  # what Slurm sends before the time limit
    wait_for(lambda: rundir.run_status(rundir.read_events(out_dir)) == "finished", "the requeued job to finish")
    ends = [e for e in rundir.read_events(out_dir) if e["event"] == "end"]
    assert [e["stop_reason"] for e in ends] == ["signal", "max_iters"] and ends[0]["iter"] < ITERS
    log = open(slurm_jobs.read_record(out_dir)["log"]).read()
    assert "requeueing job" in log and "resuming" in log
    assert losses(out_dir) == uninterrupted  # exact equality, every iteration, dropout's RNG included


def test_a_fork_suite_on_slurm_starts_each_seeds_branches_after_its_trunk_and_reports_as_run_locally(
        cluster, jobs, data_dir, tmp_path, capsys):
    """The trunks go in one array; each seed's branches in their own array, held by Slurm until that
    seed's trunk task has ended. Every run's numbers, and so the report, are the local suite's."""
    path, _ = fork_suite(tmp_path, seeds=(1, 2))
    args = suite_args(data_dir, path)
    local, on_slurm = str(tmp_path / "local"), str(tmp_path / "slurm")
    sweep.main([*args, f"--sweep_dir={local}"], launch=in_process([]))
    slurm_args = [*args, f"--sweep_dir={on_slurm}", "--launcher=slurm"]
    capsys.readouterr()
    sweep.main(slurm_args)
    out = capsys.readouterr().out
    records = {r["job"]: r for r in submitted(on_slurm, jobs)}
    names = ["trunk-seed1", "trunk-seed2", "base-seed1", "learned-seed1", "base-seed2", "learned-seed2"]
    job = {name: slurm_jobs.read_record(os.path.join(on_slurm, name))["job"] for name in names}
    array = {name: job[name].split("_")[0] for name in names}
    assert len(records) == 6 and array["trunk-seed1"] == array["trunk-seed2"]
    for seed in (1, 2):
        assert array[f"base-seed{seed}"] == array[f"learned-seed{seed}"] != array["trunk-seed1"]
        assert f"to start when trunk-seed{seed} (job {job[f'trunk-seed{seed}']}) has ended" in out
        held = subprocess.run(["squeue", "-h", "-r", "-j", array[f"base-seed{seed}"], "-o", "%E"],
                              capture_output=True, text=True).stdout.split()
        assert held == [f"afterany:{job[f'trunk-seed{seed}']}(unfulfilled)"] * 2, held  # the trunk takes seconds
    assert array["base-seed1"] != array["base-seed2"] and len({r["status_job"] for r in records.values()}) == 1

    wait_for(lambda: os.path.exists(os.path.join(on_slurm, "report.json")), "the status job's report")
    event_time = lambda name, event: next(e["time"] for e in rundir.read_events(os.path.join(on_slurm, name))
                                          if e["event"] == event)
    for name in names:
        assert losses(os.path.join(on_slurm, name)) == losses(os.path.join(local, name)), name
        if not name.startswith("trunk"):
            assert event_time(name, "checklist") > event_time(f"trunk-seed{name[-1]}", "end"), name
    assert verdicts_and_values(json.load(open(os.path.join(on_slurm, "report.json")))) == \
        verdicts_and_values(json.load(open(os.path.join(local, "report.json"))))
    capsys.readouterr()
    sweep.main(slurm_args)
    assert "nothing to submit" in capsys.readouterr().out


def test_a_cancelled_job_shows_in_status_and_resubmitting_resumes_it(cluster, jobs, data_dir, tmp_path, uninterrupted,
                                                                     capsys):
    sweep_dir = str(tmp_path / "s")
    job, out_dir = start_on_slurm(data_dir, sweep_dir, jobs, steps=CHECKPOINT_EVERY + 2)  # past the first checkpoint
    subprocess.run(["scancel", job], check=True)  # no signal named: the job is cancelled for good
    wait_for(lambda: not live(job), "the cancelled job to leave the queue", timeout=90)
    capsys.readouterr()
    sweep.main([*grid_args(data_dir), f"--sweep_dir={sweep_dir}", "--status=True"])
    out = capsys.readouterr().out
    _, state, shown_job, log = row(out, RUN)
    assert state in ("preempted", "failed") and shown_job == job and os.path.exists(log), out
    assert "0/1 runs done, 0 running, 0 queued, 1 stopped" in out
    sweep.main([*grid_args(data_dir), f"--sweep_dir={sweep_dir}", "--launcher=slurm"])
    assert slurm_jobs.read_record(out_dir)["job"] != job
    submitted(sweep_dir, jobs)
    wait_for(lambda: rundir.run_status(rundir.read_events(out_dir)) == "finished", "the resubmitted run")
    events = rundir.read_events(out_dir)
    second = [i for i, e in enumerate(events) if e["event"] == "checklist"][1]
    assert next(e["iter"] for e in events[second:] if e["event"] == "train") > CHECKPOINT_EVERY  # from a checkpoint, not scratch
    assert losses(out_dir) == uninterrupted


def test_the_multinode_example_runs_two_ranks_and_requeues_on_the_test_cluster(cluster, jobs, data_dir, tmp_path):
    """slurm/train_multinode.sbatch as shipped (HSDP, sharded checkpoints), with small overrides: one
    node, two CPU ranks under srun torchrun (gloo)."""
    (tmp_path / "tiny.py").write_text("device = 'cpu'\n")

    def submit(name):
        env = dict(os.environ, CONFIG=str(tmp_path / "tiny.py"), OUT_DIR=str(tmp_path / name), NPROC_PER_NODE="2",
                   TRAIN_ARGS=" ".join(tiny_args(data_dir, str(tmp_path / name), *LONG, "--batch_size=4",
                                                 "--gradient_accumulation_steps=2")))
        job = subprocess.run(["sbatch", "--parsable", "--nodes=1", "--gpus-per-node=0", "--cpus-per-task=1",
                              "--time=10", f"--output={tmp_path}/{name}.out", "slurm/train_multinode.sbatch"],
                             cwd=REPO, env=env, capture_output=True, text=True, check=True).stdout.strip()
        jobs.append(job)
        return job, str(tmp_path / name)

    (straight_job, straight), (job, split) = submit("straight"), submit("split")
    wait_for(lambda: len(losses(split)) >= 20, "the two-rank job's first 20 steps")
    subprocess.run(["scancel", "--signal=TERM", job], check=True)
    done = lambda out: rundir.run_status(rundir.read_events(out)) == "finished"
    wait_for(lambda: done(split) and done(straight), "both two-rank jobs to finish")
    ends = [e for e in rundir.read_events(split) if e["event"] == "end"]
    assert [e["stop_reason"] for e in ends] == ["signal", "max_iters"]
    assert os.path.exists(os.path.join(split, "dcp", "latest"))  # HSDP's sharded checkpoint was resumed
    log = open(tmp_path / "split.out").read()
    assert log.count("SIGTERM received: finishing this step") == 2, log[-3000:]  # once per rank, not twice
    assert losses(split) == losses(straight) and len(losses(straight)) == ITERS


def test_progress_line_counts_runs_and_estimates_the_time_left_from_finished_runs(tmp_path):
    def run(name, spans, finished=True):
        out = tmp_path / name
        out.mkdir()
        records = []
        for i, (start, end) in enumerate(spans):
            last = finished or i < len(spans) - 1
            records += [{"event": "checklist", "time": start},
                        {"event": "end", "time": end, "stop_reason": "max_iters" if last else "signal"}]
        (out / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        return str(out)

    # 60 s and, over two attempts with an hour in the queue between them, 30 + 90 s: 90 s on average.
    dirs = [run("a", [(0, 60)]), run("b", [(0, 30), (3630, 3720)]), run("c", [(0, 10)], finished=False),
            str(tmp_path / "d"), str(tmp_path / "e")]
    line = slurm_jobs.progress_line(dirs, running=dirs[2:3], queued=dirs[3:4], parallel=2)
    assert line.startswith("2/5 runs done, 1 running, 1 queued, 1 stopped")
    assert line.endswith("about 2 min left (mean of 2 finished runs, 2 at a time)")  # 3 runs x 90 s / 2 = 135 s
    assert slurm_jobs.progress_line(dirs[:2], [], [], 1) == "2/2 runs done, 0 running, 0 queued"
    # A run whose process is still exiting after its `end` (the local launcher has not reaped it) is done.
    assert slurm_jobs.progress_line(dirs, dirs[:1] + dirs[2:3], dirs[3:], 2).startswith(
        "2/5 runs done, 1 running, 2 queued")


def test_status_shows_the_end_of_a_failed_runs_log(tmp_path):
    log = tmp_path / "7_0.out"
    log.write_text("".join(f"line {i}\n" for i in range(20)) + "\nRuntimeError: CUDA out of memory\n\n")
    states = [dict(name="base-seed1", state="failed", logged="crashed", job="7_0", log=str(log), note=""),
              dict(name="base-seed2", state="queued", logged="not run", job="7_1", log="", note="")]
    text = slurm_jobs.status_text(states, str(tmp_path)).splitlines()
    at = text.index(f"base-seed1 failed; the end of {log}:")
    assert text[at + 1:at + 6] == ["    line 16", "    line 17", "    line 18", "    line 19",
                                   "    RuntimeError: CUDA out of memory"]
    assert text[-1].startswith("0/2 runs done, 0 running, 1 queued, 1 stopped")


def test_bad_slurm_settings_are_refused_in_one_line_and_nothing_is_submitted(cluster, data_dir, tmp_path):
    sweep_dir = str(tmp_path / "s")
    args = [*grid_args(data_dir), f"--sweep_dir={sweep_dir}", "--launcher=slurm"]
    for bad, message in (("--launcher=k8s", "--launcher='k8s': use 'local' or 'slurm'"),
                         ("--slurm_nodes=0", "slurm_nodes=0: a count, >= 1"),
                         ("--slurm_nodes=2", "slurm_nodes=2 does not divide the run's 1 ranks"),
                         ("--slurm_partition=nowhere", "sbatch refused the jobs: sbatch: error: Batch job submission failed: Invalid partition")):
        with pytest.raises(configurator.ConfigError, match=re.escape(message)):
            sweep.main([*args, bad])
    assert not [name for name in os.listdir(sweep_dir) if slurm_jobs.read_record(os.path.join(sweep_dir, name))]
    assert not os.listdir(os.path.join(sweep_dir, "slurm"))  # no script left behind for jobs never submitted
    suite = tmp_path / "suite_cluster.py"
    suite.write_text("variants = {'base': {'learning_rate': 3e-3}}\nbaseline = 'base'\nseeds = [1]\nmetric = 'val_loss'\nallowed = []\n"
                     "slurm = {'gpus': 8}\n")
    with pytest.raises(configurator.ConfigError, match=re.escape("slurm={...} sets unknown keys ['gpus']")):
        sweep.main([str(suite), *toy_args(data_dir), f"--sweep_dir={tmp_path / 'suite'}", "--launcher=slurm"])


# What slurm-wlm, munge and procps put on a machine, hidden from the set-up script below.
SLURM_TOOLS = ("munged", "munge", "mungekey", "slurmctld", "slurmd", "sbatch", "srun", "sinfo", "squeue", "scontrol",
               "scancel", "pgrep", "pkill")


def machine_without_slurm(tmp_path):
    """A PATH like this machine's minus Slurm, munge and pgrep, with an apt-get that logs its
    arguments and "installs" by bringing the real tools back into that PATH, and a non-root user
    (`id -u` says 1000) whose sudo logs and runs the command as root."""
    bin_dir, user_dir, log = tmp_path / "bin", tmp_path / "user", tmp_path / "calls.log"
    bin_dir.mkdir()
    user_dir.mkdir()
    real = {tool: shutil.which(tool) for tool in SLURM_TOOLS}
    assert all(real.values()), f"the cluster fixture installed Slurm, yet {real} lacks some"
    for directory in os.environ["PATH"].split(os.pathsep) + ["/usr/sbin", "/sbin"]:
        for name in os.listdir(directory) if os.path.isdir(directory) else []:
            if name not in (*SLURM_TOOLS, "apt-get", "sudo") and not (bin_dir / name).exists():
                (bin_dir / name).symlink_to(os.path.join(directory, name))
    links = " ".join(f"ln -sf {path} {bin_dir}/{tool};" for tool, path in real.items())
    shims = {bin_dir / "apt-get": f'echo "apt-get $*" >> {log}; [ "$1" != install ] || {{ {links} }}',
             user_dir / "id": '[ "$1" = -u ] && echo 1000 || exec /usr/bin/id "$@"',
             user_dir / "sudo": f'echo "sudo $*" >> {log}; PATH={bin_dir} exec "$@"'}  # sudo's secure_path: no user dir
    for path, body in shims.items():
        path.write_text(f"#!/bin/bash\n{body}\n")
        path.chmod(0o755)
    return dict(os.environ, PATH=f"{user_dir}:{bin_dir}"), log


def test_the_readme_test_command_sets_up_slurm_on_a_machine_without_it(cluster, tmp_path):
    """The set-up part of the README's test command, as a new user without Slurm runs it: it runs
    itself under sudo, installs the packages with apt-get, then finds the cluster up; run again it
    needs neither. Without a cluster, root or sudo it says so in one line."""
    env, log = machine_without_slurm(tmp_path)
    assert subprocess.run(["bash", "-c", "command -v sinfo sbatch pgrep"], env=env).returncode == 1  # hidden
    first = subprocess.run(SET_UP, env=env, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    assert log.read_text().splitlines() == [f"sudo bash {SET_UP[1]}", "apt-get update -qq",
                                            "apt-get install -y -qq slurm-wlm munge procps"]
    assert "installing slurm-wlm munge procps" in first.stdout
    assert re.search(r"(a Slurm cluster already answers|Slurm cluster up): ", first.stdout), first.stdout
    again = subprocess.run(SET_UP, env=env, capture_output=True, text=True)
    assert again.returncode == 0 and "installing" not in again.stdout
    assert len(log.read_text().splitlines()) == 3  # no sudo, no apt-get the second time

    os.remove(tmp_path / "user" / "sudo")
    for tool in ("scontrol", "sinfo"):  # no cluster answers: root is needed to start one
        os.remove(tmp_path / "bin" / tool)
    refused = subprocess.run(SET_UP, env=env, capture_output=True, text=True)
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1
    assert "needs root (apt-get, the daemons): run it as root, or install sudo" in refused.stderr


def test_ci_runs_exactly_the_readmes_test_command():
    readme = open(os.path.join(REPO, "README.md")).read()
    block = re.search(r"^Install and run the whole test suite:\n\n```sh\n(.*?)\n```", readme, re.S | re.M).group(1)
    printed = subprocess.run([os.path.join(REPO, ".ci", "run"), "--print"], capture_output=True, text=True, check=True)
    assert printed.stdout.strip() == block
    assert block.startswith("bash slurm/start_test_cluster.sh && ")
    # every test runs: the parallel part leaves out exactly the tests the serial part selects
    assert '-m "not alone" tests && python -m pytest -q -m alone tests' in block


def test_a_queued_run_is_labelled_requeued_only_when_its_own_job_stopped(tmp_path, monkeypatch):
    """A run cancelled, then submitted again by hand, was labelled "requeued after a preemption"."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "log.jsonl").write_text(json.dumps({"event": "checklist", "time": 100.0}) + "\n" +
                                   json.dumps({"event": "end", "time": 200.0, "stop_reason": "signal"}) + "\n")
    monkeypatch.setattr(slurm_jobs, "squeue", lambda: {"9_0": "PENDING"})
    for submitted, note in ((50.0, "requeued after a preemption"), (300.0, "submitted again: resumes from its checkpoint")):
        (out / slurm_jobs.RECORD).write_text(json.dumps(dict(job="9_0", log="", submitted=submitted)))
        [state] = slurm_jobs.run_states([("run", {}, [])], str(tmp_path))
        assert (state["state"], state["note"]) == ("queued", note)
        assert slurm_jobs.status_text([state], str(tmp_path)).splitlines()[1].endswith(f"- ({note})")


def test_the_array_task_under_the_arrays_own_id_requeues_and_a_killed_attempt_then_shows_failed(
        cluster, jobs, data_dir, tmp_path, capsys):
    """Two runs at once: the array's last task runs under the array's own job id A, for which squeue
    lists every task of the array (and `scontrol requeue A` would requeue them all). Signalled while
    the other task runs, it must requeue itself; its resumed train.py, killed -9, must then show as
    failed with the job script's word on it, not as preempted."""
    cpus = int(subprocess.run(["sinfo", "-h", "-o", "%c"], capture_output=True, text=True).stdout.split()[0])
    assert cpus >= 2, f"the test cluster offers {cpus} CPU: stop its daemons and run slurm/start_test_cluster.sh again"
    # Both tasks need a core at once: jobs an earlier test cancelled may still hold one while they end.
    wait_for(lambda: not slurm_jobs.squeue(), "the jobs of earlier tests to leave the queue", timeout=120)
    sweep_dir = str(tmp_path / "s")
    args = ["--grid=learning_rate=[3e-3,1e-3]", *toy_args(data_dir, *LONG), f"--sweep_dir={sweep_dir}"]
    sweep.main([*args, "--launcher=slurm"])
    records = submitted(sweep_dir, jobs)
    array = records[0]["job"].split("_")[0]
    other, last = (os.path.join(sweep_dir, name) for name in ("learning_rate-0.003", "learning_rate-0.001"))
    task, other_task = (slurm_jobs.read_record(d)["job"] for d in (last, other))
    squeue_array = lambda: subprocess.run(["squeue", "-h", "-j", array, "-o", "%i %T"],  # A lists every task
                                          capture_output=True, text=True).stdout.splitlines()
    wait_for(lambda: sorted(squeue_array()) == sorted([f"{task} RUNNING", f"{other_task} RUNNING"]), "both tasks to run")
    wait_for(lambda: len(losses(last)) >= 20, "the last task's first 20 steps")
    assert "end" not in [e["event"] for e in rundir.read_events(other)]  # what `scontrol requeue A` would hit
    subprocess.run(["scancel", "--signal=TERM", task], check=True)
    resumed = lambda: [e["event"] for e in rundir.read_events(last)].count("checklist") == 2
    wait_for(lambda: resumed() and rundir.read_events(last)[-1]["event"] == "train", "the requeued task to resume")
    assert "requeueing job " + task in open(slurm_jobs.read_record(last)["log"]).read()
    os.kill(int(open(os.path.join(last, rundir.LOCK_FILE)).read()), signal.SIGKILL)  # an OOM kill, say
    wait_for(lambda: not live(task), "the killed task's job to end", timeout=90)
    capsys.readouterr()
    sweep.main([*args, "--status"])
    out = capsys.readouterr().out
    assert row(out, "learning_rate-0.001")[1] == "failed", out
    assert "failed: train.py exited with status 137 (killed by signal 9) without logging its end" in out
    wait_for(lambda: rundir.run_status(rundir.read_events(other)) == "finished", "the other task to finish")


def test_local_and_slurm_runs_of_one_grid_use_one_thread_count_and_agree_bitwise(cluster, jobs, data_dir, tmp_path,
                                                                                 monkeypatch):
    """By default the local launcher ran one run with every core and a Slurm job one thread per rank:
    their losses differed in the last bits, and run_info.json did not say why."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # a user's shell, not the test runner's
    args = ["--grid=learning_rate=[3e-3]", *toy_args(data_dir, "--max_iters=40", "--lr_decay_iters=40")]
    local, on_slurm = str(tmp_path / "local"), str(tmp_path / "slurm")
    sweep.main([*args, f"--sweep_dir={local}"])  # the real launcher: train.py in a subprocess
    sweep.main([*args, f"--sweep_dir={on_slurm}", "--launcher=slurm"])
    submitted(on_slurm, jobs)
    ran = lambda sweep_dir: os.path.join(sweep_dir, RUN)
    wait_for(lambda: rundir.run_status(rundir.read_events(ran(on_slurm))) == "finished", "the Slurm run")
    threads = [rundir.read_run_info(ran(d))["facts"]["intra_op_threads"] for d in (local, on_slurm)]
    assert threads == [1, 1]
    assert losses(ran(local)) == losses(ran(on_slurm)) and len(losses(ran(local))) == 40


def test_slurm_submits_a_suite_seed_by_seed_as_the_local_launcher_starts_it(data_dir, tmp_path, monkeypatch, capsys):
    """An array's tasks start in index order, at most slurm_max_running at once: a suite submitted in its
    plan's order (every seed of base, then every seed of other) and cut short held no complete seed. The
    array holds the runs in sweep.family_order, the order run_all launches them in (sbatch faked: the
    script is the submission)."""
    scripts = []
    monkeypatch.setattr(slurm_jobs, "sbatch", lambda args: scripts.append(args[-1]) or str(len(scripts)))
    monkeypatch.setattr(slurm_jobs, "squeue", lambda: {})
    variants = {"base": LR, "other": {"learning_rate": 1e-3, "min_lr": 1e-4}}
    path, _ = write_suite(tmp_path, variants, ["learning_rate", "min_lr"], seeds=(1, 2, 3))
    runs = sweep.main([*suite_args(data_dir, path), f"--sweep_dir={tmp_path / 's'}", "--launcher=slurm",
                       "--slurm_max_running=2"])
    assert [name for name, _, _ in runs][:2] == ["base-seed1", "base-seed2"]  # the plan's order
    tasks = re.findall(r"^    (\d+)\) RUN=.*  # (\S+)$", open(scripts[0]).read(), re.MULTILINE)
    assert tasks == [(str(i), name) for i, name in enumerate(
        ["base-seed1", "other-seed1", "base-seed2", "other-seed2", "base-seed3", "other-seed3"])]
    launched = [line.split(":")[0].strip() for line in capsys.readouterr().out.splitlines()[1:7]]
    assert launched == [name for _, name in tasks]  # the listing shows the submission's order too
    assert len(scripts) == 2 and scripts[1].startswith("--wrap=")  # the array, then the status job
