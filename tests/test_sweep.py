"""sweep.py: grid expansion, constant tokens per step, skipping finished runs, the summary table."""
import csv
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
from scipy.stats import norm as scipy_norm

import configurator
import rundir
import runtime
from ablation import compare, render, suites
from slurm import jobs as slurm_jobs
import sweep
import train
from helpers import Finished, events, in_process, tiny_args, toy_args, write_growing_suite

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


GRID = '--grid=learning_rate=[1e-2, 3e-3] batch_size=[2,4]'


def test_grid_expands_to_distinct_runs(data_dir, tmp_path):
    runs = sweep.main([GRID, f"--sweep_dir={tmp_path}/s", "--tokens_per_iter=128", "--dry_run=True",
                       *toy_args(data_dir)])
    names = [name for name, _, _ in runs]
    assert names == ["learning_rate-0.01_batch_size-2", "learning_rate-0.01_batch_size-4",
                     "learning_rate-0.003_batch_size-2", "learning_rate-0.003_batch_size-4"]
    cfgs = [configurator.apply_config(runtime.DEFAULTS, argv) for _, _, argv in runs]
    assert {(c["learning_rate"], c["batch_size"]) for c in cfgs} == {(1e-2, 2), (1e-2, 4), (3e-3, 2), (3e-3, 4)}
    assert len({c["out_dir"] for c in cfgs}) == len({c["wandb_run_name"] for c in cfgs}) == 4
    assert all(c["tokens_per_iter"] == 128 and c["gradient_accumulation_steps"] == 0 for c in cfgs)
    assert not os.path.exists(tmp_path / "s")
    # A list of grids is their union (each optimizer with rates of its own regime).
    assert sweep.expand({"a": [1, 2], "b": ["x"]}) == [{"a": 1, "b": "x"}, {"a": 2, "b": "x"}]
    assert sweep.parse_grid("optimizer=[sgd, adamw] lr=[1e-3]") == {"optimizer": ["sgd", "adamw"], "lr": [1e-3]}
    with pytest.raises(configurator.ConfigError, match="both swept and fixed"):
        sweep.main([GRID, "--batch_size=8", "--dry_run=True", *toy_args(data_dir)])
    with pytest.raises(configurator.ConfigError, match="set --sweep_dir"):
        sweep.main([GRID, "--out_dir=elsewhere", "--dry_run=True", *toy_args(data_dir)])
    with pytest.raises(configurator.ConfigError, match="not a multiple of batch_size"):  # 96 / (4 x 16)
        sweep.main([GRID, "--tokens_per_iter=96", "--dry_run=True", *toy_args(data_dir)])


def test_sweep_runs_keeps_tokens_per_step_skips_finished_and_writes_the_table(data_dir, tmp_path):
    sweep_dir = str(tmp_path / "s")
    args = [GRID, f"--sweep_dir={sweep_dir}", "--tokens_per_iter=128", *toy_args(data_dir)]
    calls = []
    with pytest.raises(RuntimeError, match="1 runs failed: learning_rate-0.003_batch_size-4"):
        sweep.main(args, launch=in_process(calls, fail=("learning_rate-0.003_batch_size-4",)))
    assert len(calls) == 4
    for name in calls[:3]:
        checklist = events(os.path.join(sweep_dir, name), "checklist")[0]
        batch = 2 if name.endswith("-2") else 4
        assert (checklist["tokens_per_iter"], checklist["grad_accum_steps"]) == (128, 128 // (16 * batch))
    rows = list(csv.DictReader(open(os.path.join(sweep_dir, "summary.csv"))))
    assert [r["status"] for r in rows] == ["finished", "finished", "finished", "failed"]
    for row in rows[:3]:
        evals = events(os.path.join(sweep_dir, row["run"]), "eval")
        assert float(row["best_val_loss"]) == min(e["val_loss"] for e in evals)
        assert row["iters"] == "4"
        assert row["run"] == f"learning_rate-{row['learning_rate']}_batch_size-{row['batch_size']}"  # its own values
    # Again: the finished runs are skipped, the failed one runs.
    calls.clear()
    sweep.main(args, launch=in_process(calls))
    assert calls == ["learning_rate-0.003_batch_size-4"]
    table = open(os.path.join(sweep_dir, "summary.md")).read().splitlines()
    assert table[0].startswith("| run | batch_size | learning_rate | status | iters |") and len(table) == 6
    assert all("| finished |" in line for line in table[2:])
    calls.clear()
    sweep.main(args, launch=in_process(calls))
    assert calls == []
    # A run without its `end` event (killed after its last checkpoint) resumes from the checkpoint.
    log = os.path.join(sweep_dir, "learning_rate-0.01_batch_size-2", "log.jsonl")
    lines = open(log).read().splitlines(keepends=True)
    open(log, "w").writelines(line for line in lines if '"event": "end"' not in line)
    sweep.main(args, launch=in_process(calls))
    assert calls == ["learning_rate-0.01_batch_size-2"]
    assert [e["iter"] for e in events(os.path.dirname(log), "end")] == [4]
    assert len(events(os.path.dirname(log), "checklist")) == 2 and len(events(os.path.dirname(log), "train")) == 4


def test_sweep_file_and_overlay_run_as_subprocesses(data_dir, tmp_path):
    """The real launcher (train.py subprocesses), with a sweep file whose grid takes config files."""
    for name, lr in (("a", 1e-2), ("b", 3e-3)):
        (tmp_path / f"train_{name}.py").write_text(f"learning_rate = {lr}\n")
    (tmp_path / "sweep_two.py").write_text(
        "import os\n_here = os.path.dirname(__file__)\n"
        "grid = {'config': [os.path.join(_here, 'train_a.py'), os.path.join(_here, 'train_b.py')]}\n"
        f"sweep_dir = {str(tmp_path / 'out-sweep-two')!r}\n")
    (tmp_path / "overlay.py").write_text("beta2 = 0.9\n")
    sweep.main([str(tmp_path / "sweep_two.py"), str(tmp_path / "overlay.py"), "--gpus=0", *toy_args(data_dir)])
    sweep_dir = tmp_path / "out-sweep-two-overlay"  # an overlay gets its own directory
    rows = list(csv.DictReader(open(sweep_dir / "summary.csv")))
    assert [(r["run"], r["status"], r["iters"]) for r in rows] == [("a", "finished", "4"), ("b", "finished", "4")]
    config = json.load(open(sweep_dir / "b" / "config.json"))
    assert (config["learning_rate"], config["beta2"], config["wandb_run_name"]) == (3e-3, 0.9, "sweep-two-overlay-b")
    assert "step 4: train loss" in open(sweep_dir / "b" / "console.txt").read()


def test_the_pre_flight_refuses_what_train_py_would(data_dir, tmp_path):
    """sweep.py settles and validates each run with train.py's own pair (runtime.resolve), dtype included."""
    with pytest.raises(configurator.ConfigError, match="dtype='bf16': use one of"):
        sweep.main([GRID, f"--sweep_dir={tmp_path}/s", "--dry_run=True", *toy_args(data_dir), "--dtype=bf16"])
    assert not os.path.exists(tmp_path / "s")


def test_a_sharded_suite_run_stopped_after_a_checkpoint_resumes_from_it(data_dir, tmp_path, capsys):
    """An FSDP run of a suite (torchrun, 2 gloo ranks) keeps its checkpoint in dcp/, not ckpt.pt: running
    the suite again continues it from there instead of starting it over at iteration 1."""
    suite = tmp_path / "suite_fsdp.py"
    suite.write_text("variants = {'base': {}}\nbaseline = 'base'\nseeds = [1]\nmetric = 'val_loss'\n"
                     f"allowed = []\nnproc = 2\nsuite_dir = {str(tmp_path / 'out')!r}\n")
    args = [str(suite), "--data_parallel=fsdp", "--optimizer_impl=foreach",
            *(a for a in tiny_args(data_dir, "unused") if not a.startswith("--out_dir="))]
    sweep.main([*args, "--max_iters=4"])
    run = tmp_path / "out" / "base-seed1"
    assert os.path.exists(run / "dcp" / "latest") and not os.path.exists(run / "ckpt.pt")
    # Killed after its checkpoint at iteration 4: the log has no `end` event.
    log = run / "log.jsonl"
    log.write_text("".join(line for line in open(log) if '"event": "end"' not in line))
    capsys.readouterr()
    sweep.main([*args, "--max_iters=8"])
    assert "resume base-seed1 from its checkpoint" in capsys.readouterr().out
    assert [e["iter"] for e in events(str(run), "train")] == list(range(1, 9))  # nothing trained twice
    assert [e["iter"] for e in events(str(run), "eval")] == [0, 4, 4, 8]  # a resumed run evaluates where it starts
    assert open(run / "dcp" / "latest").read().strip() == "iter_0000008"


def test_the_documented_status_command_takes_a_bare_flag(data_dir, tmp_path):
    """`python sweep.py SUITE --status` as the README and docs/slurm.md print it: a bare boolean flag
    means True (it answered "override '--status' needs a value")."""
    done = subprocess.run([sys.executable, "sweep.py", GRID, f"--sweep_dir={tmp_path}/s", *toy_args(data_dir),
                           "--status"], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "0/4 runs done, 0 running, 0 queued, 4 stopped" in done.stdout


def test_the_progress_line_never_counts_a_finished_run_as_running(data_dir, tmp_path, capsys):
    """A run logs its `end` before its process exits: the line printed as the first run is reaped
    said "2/4 runs done, 1 running, 2 queued, -1 stopped"."""
    class Exiting(Finished):  # still exiting when first asked, as a real process often is
        asked = False

        def poll(self):
            self.asked, asked = True, self.asked
            return self.returncode if asked else None

    launch = in_process([])
    sweep.main([GRID, f"--sweep_dir={tmp_path}/s", "--cpu_runs=2", *toy_args(data_dir)],
               launch=lambda argv, gpu, log: Exiting(launch(argv, gpu, log).returncode))
    lines = [line for line in capsys.readouterr().out.splitlines() if " runs done, " in line]
    assert len(lines) == 4 and not [line for line in lines if "stopped" in line]
    for line in lines:
        done, total, running, queued = map(int, re.match(r"(\d+)/(\d+) runs done, (\d+) running, (\d+) queued",
                                                         line).groups())
        assert done + running + queued == total == 4, line


def test_a_cpu_machine_runs_one_run_per_core_with_the_threads_a_slurm_job_gets(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    assert sweep.default_gpus("") == ["cpu:1#0", "cpu:1#1", "cpu:1#2", "cpu:1#3"]
    assert sweep.default_gpus("", nproc=2) == ["cpu:1#0", "cpu:1#1"]  # torchrun's 2 ranks, a core each
    assert sweep.default_gpus("", cpu_runs=1) == ["cpu:4#0"]  # asked for: one run with every core
    assert sweep.default_gpus("0,1") == ["0", "1"]
    # A Slurm job's rank gets one thread unless slurm_cpus_per_task asks for more: the same count.
    res = dict(nodes=1, cpus_per_task=0, max_running=0, gpus_per_node=0, partition="", time="", account="",
               qos="", signal_s=300, sbatch="")
    assert "OMP_NUM_THREADS=1\n" in slurm_jobs.array_script([("a", ["--out_dir=x"])], "s", res, 1, "s")


def test_the_thread_count_is_a_measured_fact_that_the_confound_check_compares(data_dir, tmp_path):
    short = ("--max_iters=2", "--lr_decay_iters=2", "--eval_interval=2")  # the fact is measured at the start
    procs = {threads: subprocess.Popen([sys.executable, "train.py", *tiny_args(data_dir, str(tmp_path / f"t{threads}"),
                                                                               *short)],
                                       cwd=REPO, env=dict(os.environ, OMP_NUM_THREADS=str(threads)),
                                       stdout=subprocess.DEVNULL) for threads in (1, 2)}
    assert [proc.wait() for proc in procs.values()] == [0, 0]
    runs = {threads: rundir.read_run(str(tmp_path / f"t{threads}")) for threads in procs}
    assert [runs[t]["info"]["facts"]["intra_op_threads"] for t in (1, 2)] == [1, 2]
    assert compare.fact_differences(runs[2], runs[1], allowed=[]) == {"intra_op_threads": (2, 1)}


def test_runs_whose_data_is_missing_are_refused_before_any_starts_or_is_submitted(data_dir, tmp_path):
    """dataset='nope' was submitted as one Slurm job per run, each sure to fail at start-up."""
    calls = []
    for launcher in ("local", "slurm"):
        with pytest.raises(configurator.ConfigError, match=r"run learning_rate-0.01_batch_size-2: \S*"
                                                           r"data/nope/train.bin not found: prepare the dataset"):
            sweep.main([GRID, f"--sweep_dir={tmp_path}/{launcher}", *toy_args(data_dir), "--data_dir=",
                        "--dataset=nope", f"--launcher={launcher}"], launch=in_process(calls))
        assert not os.path.exists(tmp_path / launcher)
    assert calls == []


def test_a_report_whose_runs_are_gone_says_it_is_stale_until_rebuilt(data_dir, tmp_path, capsys):
    from helpers import LR, suite_args, write_suite
    path, suite_dir = write_suite(tmp_path, {"base": LR, "low": {"learning_rate": 1e-3, "min_lr": 1e-4}},
                                  ["learning_rate", "min_lr"], seeds=(1,))
    sweep.main(suite_args(data_dir, path), launch=in_process([]))
    report = open(os.path.join(suite_dir, "report.md")).read()
    shutil.rmtree(os.path.join(suite_dir, "low-seed1"))
    capsys.readouterr()
    for _ in range(2):  # marked once, however often it is asked
        sweep.main([*suite_args(data_dir, path), "--status=True"])
        assert f"{suite_dir}/report.md is stale: 1 of its runs changed or were deleted" in capsys.readouterr().out
        assert open(os.path.join(suite_dir, "report.md")).read() == (
            "> **Stale**: low-seed1 changed or was deleted since this was built; it is rebuilt when every run has "
            "finished.\n\n" + report)
    sweep.main(suite_args(data_dir, path), launch=in_process([]))
    assert not open(os.path.join(suite_dir, "report.md")).read().startswith("> **Stale**")


# ----------------------------------------------------------------------------- the suite's record: growth and looks

FACTS = dict(dataset_fingerprint="d", tokenizer="t", eval_windows="w", data_order="o", init_weights={})


def written_runs(calls, worse=lambda cfg: cfg["learning_rate"] > 1e-3):
    """A launcher that writes a finished run directory (config, run record, log; a branch's fork event)
    instead of training, so the sweep, its record and its report run as they do: a run that is `worse`
    is 0.03 worse, give or take."""
    def launch(argv, gpu, log_path):
        cfg = configurator.apply_config(runtime.DEFAULTS, argv)
        calls.append(os.path.basename(cfg["out_dir"]))
        value = 2.0 + 0.01 * cfg["seed"] + (0.03 + 0.004 * (-1) ** cfg["seed"] if worse(cfg) else 0)
        with open(os.path.join(cfg["out_dir"], "config.json"), "w") as f:
            json.dump(cfg, f)
        with open(os.path.join(cfg["out_dir"], "run_info.json"), "w") as f:
            json.dump(dict(facts=FACTS, resumes=[], code_versions=["x"]), f)
        with open(os.path.join(cfg["out_dir"], "log.jsonl"), "w") as f:
            if cfg["fork_from"]:
                f.write(json.dumps(dict(event="fork", iter=0, trunk=cfg["fork_from"])) + "\n")
            for i, v in enumerate([3.0, value]):
                f.write(json.dumps(dict(event="eval", iter=i, tokens=1000 * i, val_loss=v)) + "\n")
            f.write(json.dumps(dict(event="end", iter=1, tokens=1000, stop_reason="max_iters")) + "\n")
        return Finished(0)
    return launch


def test_seeds_added_after_a_look_never_rewrite_the_declaration_and_the_report_says_so(data_dir, tmp_path):
    """Issue 31: freeze_suite rewrote the declared seeds [1, 2] -> [1, 2, 3, 4] and the report still said
    the plan was declared before the runs. Now suite.json stays as written, the record says what was
    added after how many looks, and the report says the verdict is not at nominal alpha."""
    calls = []
    path, suite_dir = write_growing_suite(tmp_path, [1, 2, 3])
    sweep.main([path, *toy_args(data_dir)], launch=written_runs(calls))
    declared = open(os.path.join(suite_dir, "suite.json")).read()
    first = json.load(open(os.path.join(suite_dir, "report.json")))
    assert first["look"]["code"] == "one_look" and first["look"]["seeds"] == 3 and first["alpha"] == 0.05
    path, _ = write_growing_suite(tmp_path, [1, 2, 3, 4, 5])
    sweep.main([path, *toy_args(data_dir)], launch=written_runs(calls))
    assert calls == [f"{v}-seed{s}" for s in (1, 2, 3) for v in ("base", "other")] + \
           [f"{v}-seed{s}" for s in (4, 5) for v in ("base", "other")]  # seed by seed: complete pairs
    assert open(os.path.join(suite_dir, "suite.json")).read() == declared
    assert json.loads(declared)["seeds"] == [1, 2, 3]
    record = [json.loads(line) for line in open(os.path.join(suite_dir, "suite_record.jsonl"))]
    assert [(e["event"], e.get("seeds"), e.get("looks_before")) for e in record] == [
        ("look", 3, None), ("added", None, 1), ("look", 5, None)]
    assert sorted(record[1]["runs"]) == ["base-seed4", "base-seed5", "other-seed4", "other-seed5"]
    result = json.load(open(os.path.join(suite_dir, "report.json")))
    assert result["variants"]["other"]["n"] == 5
    look = result["look"]  # not at nominal alpha: 2 looks without a plan, and the runs added after the first
    assert look["code"] == "unplanned_looks" and look["looks"] == [3, 5] and not look["planned"]
    assert look["added"] == dict(runs=["base-seed4", "base-seed5", "other-seed4", "other-seed5"], looks_before=1)
    # rebuilding the report at the same seed count is no new look
    report_text = open(os.path.join(suite_dir, "report.md")).read()
    import report
    report.main([suite_dir])
    assert open(os.path.join(suite_dir, "report.md")).read() == report_text


def test_a_declared_group_sequential_plan_spends_alpha_over_its_looks(data_dir, tmp_path):
    calls = []
    path, suite_dir = write_growing_suite(tmp_path, [1, 2, 3], looks=[3, 5])
    sweep.main([path, *toy_args(data_dir)], launch=written_runs(calls))
    first = json.load(open(os.path.join(suite_dir, "report.json")))
    spent = lambda t: 2 * scipy_norm.sf(scipy_norm.isf(0.025) / t ** 0.5)  # O'Brien-Fleming-type spending
    assert first["alpha"] == pytest.approx(spent(3 / 5)) and (first["look"]["code"], first["look"]["number"], first["look"]["planned"]) == ("planned_look", 1, [3, 5])
    path, _ = write_growing_suite(tmp_path, [1, 2, 3, 4, 5], looks=[3, 5])
    sweep.main([path, *toy_args(data_dir)], launch=written_runs(calls))
    second = json.load(open(os.path.join(suite_dir, "report.json")))
    assert second["alpha"] == pytest.approx(0.05 - spent(3 / 5)) and (second["look"]["code"], second["look"]["number"], second["look"]["planned"]) == ("planned_look", 2, [3, 5])
    path, _ = write_growing_suite(tmp_path, [1, 2, 3, 4, 5], looks=[3, 6])
    with pytest.raises(configurator.ConfigError, match=r"declared looks=\[3, 5\] before its runs"):
        sweep.main([path, *toy_args(data_dir)], launch=written_runs(calls))


def test_a_suite_rerun_with_another_recipe_is_refused_before_anything_runs(data_dir, tmp_path):
    """Issue 41: re-run with --learning_rate and a new seed, the old seeds were skipped as finished,
    the new one trained on the new recipe and the report pooled them."""
    calls = []
    path, suite_dir = write_growing_suite(tmp_path, [1, 2, 3])
    sweep.main([path, *toy_args(data_dir), "--min_lr=1e-4"], launch=written_runs(calls))
    with pytest.raises(configurator.ConfigError, match=r"6 run\(s\) in .* were started with another recipe than this "
                                                       r"sweep plans: base-seed1 \(min_lr=0.0001 there, 0.0002 now\)"):
        sweep.main([path, *toy_args(data_dir), "--min_lr=2e-4", "--seeds=1,2,3,4"], launch=written_runs(calls))
    assert len(calls) == 6
    # and a report over seeds of two recipes (made by hand) is not comparable
    run = os.path.join(suite_dir, "base-seed3")
    cfg = json.load(open(os.path.join(run, "config.json")))
    json.dump(dict(cfg, min_lr=2e-4), open(os.path.join(run, "config.json"), "w"))
    import report
    report.main([suite_dir])
    result = json.load(open(os.path.join(suite_dir, "report.json")))
    assert any((m["code"], m["run"], m["key"], m["value"], m["other"], m["other_value"]) == (
        "recipe", "base-seed3", "min_lr", 0.0002, "base-seed1", 0.0001) for m in result["measurement_problems"])
    assert result["variants"]["other"]["verdict"] == "not comparable"


def test_a_crashed_sweeps_report_with_no_tested_verdict_is_no_look(data_dir, tmp_path):
    """Issue 41: after a crash the rerun's report said NOT AT NOMINAL ALPHA: 2 looks, the crashed
    sweep's report (every verdict incomplete) having been recorded as a look."""
    calls, write = [], written_runs([])

    def crash_one(argv, gpu, log_path):
        cfg = configurator.apply_config(runtime.DEFAULTS, argv)
        calls.append(os.path.basename(cfg["out_dir"]))
        if calls[-1] == "other-seed2" and calls.count("other-seed2") == 1:
            rundir.RunLog(dict(runtime.DEFAULTS, out_dir=cfg["out_dir"]), True).event("checklist", "killed")
            return Finished(137)
        return write(argv, gpu, log_path)
    path, suite_dir = write_growing_suite(tmp_path, [1, 2, 3])
    with pytest.raises(RuntimeError, match="1 runs failed: other-seed2"):
        sweep.main([path, *toy_args(data_dir)], launch=crash_one)
    crashed = json.load(open(os.path.join(suite_dir, "report.json")))
    assert crashed["variants"]["other"]["verdict"] == "incomplete"
    assert not os.path.exists(os.path.join(suite_dir, "suite_record.jsonl"))
    sweep.main([path, *toy_args(data_dir)], launch=crash_one)
    final = json.load(open(os.path.join(suite_dir, "report.json")))
    assert final["look"]["code"] == "one_look" and final["look"]["looks"] == [3] and final["alpha"] == 0.05


def test_a_deleted_suite_json_is_never_declared_again_after_a_look(data_dir, tmp_path):
    """Issue 41: suite.json deleted, then the metric re-declared after a look: it was rewritten silently
    and the report claimed the new metric was declared before the runs."""
    calls = []
    path, suite_dir = write_growing_suite(tmp_path, [1, 2, 3])
    sweep.main([path, *toy_args(data_dir)], launch=written_runs(calls))
    os.remove(os.path.join(suite_dir, "suite.json"))
    with open(path, "a") as f:
        f.write("metric = 'train_loss'\n")
    with pytest.raises(configurator.ConfigError, match="suite.json is missing but .*suite_record.jsonl holds 1 look"):
        sweep.main([path, *toy_args(data_dir)], launch=written_runs(calls))
    assert not os.path.exists(os.path.join(suite_dir, "suite.json")) and len(calls) == 6


def test_plan_options_and_seeds_are_checked_in_one_line_each(data_dir, tmp_path, capsys):
    """Issue 41: --budget=30 (no unit), 0m (ignored), 10s (advised range(1, 1)); a pilot that is missing,
    a file or a run directory read as "no pilot"; --seeds=-1 accepted, then a traceback in train.py."""
    path, suite_dir = write_growing_suite(tmp_path, [1, 2, 3])
    sweep.main([path, *toy_args(data_dir)], launch=written_runs([]))
    plan = lambda *extra: sweep.main([path, *toy_args(data_dir), "--plan=True", *extra])
    for budget, message in (("30", "--budget='30' has no unit: write 30s, 30m or 30h"),
                            ("0m", "--budget='0m': a budget must be longer than 0")):
        with pytest.raises(configurator.ConfigError, match=message):
            plan(f"--budget={budget}")
    (tmp_path / "notes.txt").write_text("x")
    for pilot, message in ((tmp_path / "gone", "does not exist"), (tmp_path / "notes.txt", "is a file"),
                           (os.path.join(suite_dir, "base-seed1"), "is one run's directory, not a suite")):
        with pytest.raises(configurator.ConfigError, match=f"--pilot: {pilot} {message}"):
            plan(f"--pilot={pilot}")
    capsys.readouterr()
    plan("--budget=0.000000001s")
    out = capsys.readouterr().out
    # the pilot's seeds are fake runs of well over a microsecond each (a fast machine writes them in a fraction
    # of a millisecond): a nanosecond fits none of them
    assert re.search(r"fits [01] seed\(s\), fewer than the 2 a paired test needs: raise --budget", out), out
    assert "range(1, 1)" not in out
    with pytest.raises(configurator.ConfigError, match="--seeds='-1': distinct integers >= 0"):
        sweep.main([path, *toy_args(data_dir), "--seeds=-1"], launch=written_runs([]))
    with pytest.raises(configurator.ConfigError, match="seed must be >= 0"):
        train.main(tiny_args(data_dir, str(tmp_path / "neg"), "--seed=-1"))


def test_status_names_a_local_sweeps_waiting_runs_queued_and_a_read_only_suite_is_one_line(data_dir, tmp_path,
                                                                                           capsys, monkeypatch):
    path, suite_dir = write_growing_suite(tmp_path, [1, 2, 3])  # 3 seeds: the blocked analysis tests (a look)
    os.makedirs(suite_dir)
    with open(os.path.join(suite_dir, rundir.LOCK_FILE), "w") as f:
        f.write(str(os.getppid()))  # a live process other than this one holds the sweep: a local sweep runs
    sweep.main([path, *toy_args(data_dir), "--status=True"])
    out = capsys.readouterr().out
    assert "0/6 runs done, 0 running, 6 queued" in out and "stopped" not in out
    os.remove(os.path.join(suite_dir, rundir.LOCK_FILE))
    sweep.main([path, *toy_args(data_dir)], launch=written_runs([]))

    def read_only(*args, **kwargs):  # tests may run as root, who writes anywhere: the file system refuses here
        raise OSError(30, "Read-only file system", os.path.join(suite_dir, "suite_record.jsonl"))
    monkeypatch.setattr(suites, "append_suite_record", read_only)
    os.remove(os.path.join(suite_dir, "suite_record.jsonl"))  # the report is a new look again
    with pytest.raises(rundir.RunDirError, match="read-only file system while writing .*suite_record.jsonl; no report "
                                                 "was written"):
        sweep.main([path, *toy_args(data_dir), "--status=True"])
    import report
    with pytest.raises(rundir.RunDirError, match="no report was written, because a look the record does not keep"):
        report.main([suite_dir, f"--out={tmp_path / 'elsewhere'}"])
    assert not os.path.exists(tmp_path / "elsewhere" / "report.md")
    with pytest.raises(rundir.RunDirError, match="is a file"):
        report.main([suite_dir, f"--out={path}"])
    monkeypatch.setattr(render, "write_report", lambda *a: (_ for _ in ()).throw(
        OSError(28, "No space left on device", os.path.join(suite_dir, "report.md"))))
    with pytest.raises(rundir.RunDirError, match="no space left on device while writing .*report.md; the report is "
                                                 "incomplete"):
        report.main([os.path.join(suite_dir, "base-seed1"), os.path.join(suite_dir, "other-seed1")])


# ----------------------------------------------------------------------------- issue 50: suite files as written

SUITE = ("variants = {'base': {'learning_rate': 1e-2}, 'lr': {'learning_rate': 3e-3}}\nbaseline = 'base'\nseeds = [1, 2]\n"
         "metric = 'val_loss'\nallowed = ['learning_rate']\n")


@pytest.mark.parametrize("text, message", [
    ("variants = {'base': {}\n", r"suite_file.py:1: syntax error \("),
    (SUITE + "min_effect = 0.01 / undefined_name\n", "suite_file.py:6: NameError: name 'undefined_name' is not defined"),
    (SUITE + "min_effect = 1 / 0\n", "suite_file.py:6: ZeroDivisionError: division by zero"),
    (SUITE + "fork_at = 2\nbridge_seed = [1, 2]\n", "suite 'suite_file' sets 'bridge_seed', which is no suite key: did "
                                                   "you mean 'bridge_seeds'\\?"),
    (SUITE + "fork_at = 2\nbridge_seeds = [True, 2]\n", r"^bridge_seeds=\[True, 2\]: a list of at least 2 distinct "
                                                        r"integers >= 0"),
], ids=["syntax error", "NameError", "ZeroDivisionError", "misspelled key", "boolean bridge seed"])
def test_a_broken_suite_file_is_one_line_naming_what_to_fix(data_dir, tmp_path, text, message):
    """Issue 50: a syntax error gave "no grid", a failing line a raw traceback, `bridge_seed` was ignored
    (the suite ran without its bridge), bridge_seeds=[True, 2] was reported as an error in `seed`."""
    path = tmp_path / "suite_file.py"
    path.write_text(text)
    with pytest.raises(configurator.ConfigError, match=message) as refused:
        sweep.main([str(path), *toy_args(data_dir), "--dry_run=True"])
    assert "\n" not in str(refused.value)


def test_a_suite_whose_variants_are_set_through_exec_is_a_suite(data_dir, tmp_path):
    """Issue 50: `variants` set only through exec (a suite built on another) gave "no grid"."""
    (tmp_path / "common.py").write_text(SUITE)
    path = tmp_path / "suite_exec.py"
    path.write_text("import os\nexec(open(os.path.join(os.path.dirname(__file__), 'common.py')).read())\n")
    runs = sweep.main([str(path), *toy_args(data_dir), "--dry_run=True"])
    assert [name for name, _, _ in runs] == ["base-seed1", "base-seed2", "lr-seed1", "lr-seed2"]


def test_a_budget_of_320_nines_is_one_line(data_dir, tmp_path):
    """Issue 50: --budget of 320 nines (a float's infinity) ended in a NaN traceback."""
    path = tmp_path / "suite_file.py"
    path.write_text(SUITE)
    with pytest.raises(configurator.ConfigError, match=r"^--budget=999999999999\.\.\.: too large to be a time; write "
                                                       r"one such as 30m or 2h$"):
        sweep.main([str(path), *toy_args(data_dir), "--plan=True", f"--budget={'9' * 320}s"])


def test_a_report_never_overwrites_another_suites_report(data_dir, tmp_path):
    """Issue 50: report.py --out=<another suite's directory> silently overwrote that suite's report."""
    import report
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first, first_dir = write_growing_suite(tmp_path / "a", [1, 2])
    second, second_dir = write_growing_suite(tmp_path / "b", [1, 2])
    for path in (first, second):
        sweep.main([path, *toy_args(data_dir)], launch=written_runs([]))
    kept = open(os.path.join(second_dir, "report.md")).read()
    for dirs in ([first_dir], [os.path.join(first_dir, "base-seed1"), os.path.join(first_dir, "other-seed1")]):
        with pytest.raises(configurator.ConfigError, match=f"^--out={second_dir} is another suite's directory: "
                                                           f"writing there would overwrite its report; choose a new --out$"):
            report.main([*dirs, f"--out={second_dir}"])
    assert open(os.path.join(second_dir, "report.md")).read() == kept
    report.main([first_dir, f"--out={first_dir}"])  # its own directory: rebuilt in place


def test_status_counts_a_runs_start_up_in_the_time_left(data_dir, tmp_path, capsys):
    """Issue 50: --status said "about 3 s left" for runs of about 25 s: a run's log starts at its
    checklist, after the imports and the model build that are most of a short run."""
    path, suite_dir = write_growing_suite(tmp_path, [1, 2])
    sweep.main([path, *toy_args(data_dir)], launch=written_runs([]))
    with open(os.path.join(suite_dir, suites.LAUNCHES), "w") as f:  # each process as the launcher timed it
        f.writelines(json.dumps(dict(run=name, start=100.0, end=125.0, exit=0)) + "\n"
                     for name in ("base-seed1", "base-seed2", "other-seed1", "other-seed2"))
    capsys.readouterr()
    sweep.main([path, *toy_args(data_dir), "--seeds=1,2,3", "--status=True"])
    out = capsys.readouterr().out
    assert "4/6 runs done, 0 running, 0 queued, 2 stopped" in out
    assert "; about 50 s left (mean of 4 finished runs, 1 at a time)" in out


# ----------------------------------------------------------------------------- seeds as pairs

def write_gate_suite(tmp_path, name, extra=""):
    path = tmp_path / f"{name}.py"
    path.write_text("variants = {'base': {'model_type': 'ra'}, 'gated': {'model_type': 'ra', 'attn_gate': True}}\n"
                    f"baseline = 'base'\nseeds = [1, 2, 3]\nmetric = 'val_loss'\nmin_effect = 0.01\n"
                    f"allowed = ['attn_gate']\noverrides = {{'learning_rate': 1e-2, 'batch_size': 4}}\n"
                    f"suite_dir = {str(tmp_path / ('out-' + name))!r}\n{extra}")
    return str(path), str(tmp_path / f"out-{name}")


def test_a_suite_runs_seed_by_seed_so_a_stopped_one_holds_complete_pairs(data_dir, tmp_path):
    """Trunk, then that seed's branches, seed by seed; the bridge's from-scratch pairs after, seed by seed."""
    path, _ = write_gate_suite(tmp_path, "forked", "fork_at = 1\nbridge_seeds = [1, 2]\nfork_cold_starts = ['gated']\n")
    calls = []
    sweep.main([path, *toy_args(data_dir)], launch=written_runs(calls, worse=lambda cfg: cfg["attn_gate"]))
    assert calls == [name for s in (1, 2, 3) for name in (f"trunk-seed{s}", f"base-seed{s}", f"gated-seed{s}")] + \
        [f"scratch-{v}-seed{s}" for s in (1, 2) for v in ("base", "gated")]


def test_a_forked_suites_bridge_pilots_a_suite_from_scratch(data_dir, tmp_path, capsys):
    """--plan --pilot: a suite from scratch is planned from a forked pilot's bridge (its paired runs from
    scratch, timed without a trunk), a forked suite from the pilot's forked runs."""
    forked, forked_dir = write_gate_suite(tmp_path, "forked", "fork_at = 1\nbridge_seeds = [1, 2, 3]\n"
                                                              "fork_cold_starts = ['gated']\n")
    sweep.main([forked, *toy_args(data_dir)], launch=written_runs([], worse=lambda cfg: cfg["attn_gate"]))
    scratch, _ = write_gate_suite(tmp_path, "scratch")
    capsys.readouterr()
    sweep.main([scratch, *toy_args(data_dir), "--plan", f"--pilot={forked_dir}"])
    planned = capsys.readouterr().out
    assert f"from pilot {forked_dir}'s bridge (every run trained from scratch" in planned
    assert "wall time per seed" in planned and "+ its trunk" not in planned
    sweep.main([forked, *toy_args(data_dir), "--plan", f"--pilot={forked_dir}"])
    planned = capsys.readouterr().out
    assert f"from pilot {forked_dir} (forked at step" in planned and "+ its trunk" in planned


# ----------------------------------------------------------------------------- equal FLOPs at a schedule's end

def test_equal_flops_runs_end_their_schedule_at_the_baselines_flops():
    """Issue 58: the RA twin's learn read its equal-FLOPs value at step 1,614 of 2,000, its learning rate
    still decaying. With equal_flops_runs each costlier variant also runs '<variant>-flops-seed<s>' whose
    budget and cosine end there: 2,000 x 1,642,752 / 2,035,992 FLOPs per token = 1,613.7 -> 1,614 steps,
    warmup and min_lr kept; the baseline costs itself and gets none; no run evaluates mid-schedule."""
    spec, _ = sweep.parse_args(["suites/ra_shakespeare.py"])
    assert not spec["suite"]["equal_flops_runs"]  # off unless declared
    spec["suite"]["equal_flops_runs"] = True
    seeds = spec["suite"]["seeds"]
    cfgs = {name: sweep.resolve(argv, 1) for name, _, argv in sweep.plan_runs(spec)}
    base = cfgs[f"baseline-seed{seeds[0]}"]
    assert (runtime.flops_per_token(base), runtime.flops_per_token(cfgs[f"learn-seed{seeds[0]}"])) == (1_642_752, 2_035_992)
    ends = {name: (cfg["max_iters"], cfg["lr_decay_iters"]) for name, cfg in cfgs.items() if "-flops-" in name}
    assert ends == {f"{v}-flops-seed{s}": (at, at) for v, at in (("early", 1887), ("late", 1887), ("all", 1786),
                                                                 ("learn", 1614)) for s in seeds}
    for name in ends:
        cfg, own = cfgs[name], cfgs[name.replace("-flops", "")]
        assert (cfg["warmup_iters"], cfg["min_lr"], cfg["learning_rate"], cfg["max_tokens"]) == \
            (own["warmup_iters"], own["min_lr"], own["learning_rate"], 0)
        assert cfg["out_dir"] == os.path.join("out-suite-ra_shakespeare", name) and cfg["seed"] == own["seed"]
    assert all(cfg["eval_at"] == [] for cfg in cfgs.values())


def flops_runs_written(calls):
    """A launcher that writes a finished run whose final val_loss follows its own last iteration (0.001 per
    step) and its gate (0.005, give or take by seed), with its model's FLOPs per token in its checklist."""
    def launch(argv, gpu, log_path):
        cfg = sweep.resolve(argv, 1)
        calls.append(os.path.basename(cfg["out_dir"]))
        last, tpi = runtime.last_iter(cfg), cfg["tokens_per_iter"]
        value = 2.0 + 0.01 * cfg["seed"] + 0.001 * last + (0.005 + 0.002 * (-1) ** cfg["seed"] if cfg["attn_gate"] else 0)
        for name, body in (("config.json", cfg), ("run_info.json", dict(facts=FACTS, resumes=[], code_versions=["x"]))):
            with open(os.path.join(cfg["out_dir"], name), "w") as f:
                json.dump(body, f)
        events = [dict(event="checklist", time=0.0, flops_per_token=runtime.flops_per_token(cfg), tokens_per_iter=tpi,
                       parameters=1),
                  dict(event="eval", iter=0, tokens=0, val_loss=3.0), dict(event="eval", iter=last, tokens=last * tpi,
                                                                           val_loss=value),
                  dict(event="end", time=1.0, iter=last, tokens=last * tpi, train_time=1.0, stop_reason="max_iters")]
        with open(os.path.join(cfg["out_dir"], "log.jsonl"), "w") as f:
            f.write("".join(json.dumps(e) + "\n" for e in events))
        return Finished(0)
    return launch


@pytest.mark.parametrize("declared", [True, False])
def test_the_equal_flops_view_reads_the_schedule_end_runs_final_evaluation_or_says_there_is_none(
        data_dir, tmp_path, declared):
    """A gated variant (1.07x FLOPs per token) of 16 steps: its schedule-end runs end at 15 steps, and the
    equal-FLOPs view reads their final evaluation against the baseline's; undeclared, it says there are none."""
    path, suite_dir = write_gate_suite(tmp_path, "flops", "equal_flops_runs = True\n" if declared else "")
    calls = []
    sweep.main([path, *toy_args(data_dir, "--max_iters=16", "--lr_decay_iters=16")], launch=flops_runs_written(calls))
    flops_runs = [f"gated-flops-seed{s}" for s in (1, 2, 3)]
    assert sorted(c for c in calls if "-flops-" in c) == (flops_runs if declared else [])
    declaration = json.load(open(os.path.join(suite_dir, "suite.json")))
    assert declaration["equal_flops_runs"] is (True if declared else None)
    assert declaration.get("flops_runs", {}) == ({n: ["gated", s] for n, s in zip(flops_runs, (1, 2, 3))} if declared else {})
    report = json.load(open(os.path.join(suite_dir, "report.json")))
    m = report["variants"]["gated"]["compute_matched"]
    assert report["compared_at_tokens"] == 16 * json.load(open(os.path.join(suite_dir, "base-seed1", "config.json")))[
        "tokens_per_iter"]
    if declared:
        assert m["read_from"] == "schedule_end" and m["evaluated_at"] == {
            f"seed{s}": 15 * report["variants"]["base"]["cost"]["tokens_per_iter"] for s in (1, 2, 3)}
        assert m["differences"] == pytest.approx([-0.001 + 0.005 + 0.002 * (-1) ** s for s in (1, 2, 3)])
        assert report["variants"]["gated"]["differences"] == pytest.approx([0.005 + 0.002 * (-1) ** s for s in (1, 2, 3)])
    else:
        assert m["read_from"] is None and m["verdict"] == "not evaluated" and m["differences"] == []
        assert m["reasons"] == [dict(code="no_schedule_end_run")]
        assert "no run whose schedule ends at the baseline's FLOPs" in open(os.path.join(suite_dir, "report.md")).read()


def test_equal_flops_runs_are_refused_where_no_schedule_can_end_at_the_matched_compute(data_dir, tmp_path):
    """With fork_at (a branch continues its trunk's schedule), with a non-boolean, and in a budget so short
    that no whole step lies within 1% of the baseline's FLOPs (4 steps / 1.07 = 3.74): one line each, before any run."""
    for name, extra, message in (("forked", "fork_at = 1\nequal_flops_runs = True\n", "in a suite without fork_at"),
                                 ("yes", "equal_flops_runs = 'yes'\n", "equal_flops_runs='yes': True or False"),
                                 ("short", "equal_flops_runs = True\n", "give the suite a longer budget")):
        path, suite_dir = write_gate_suite(tmp_path, name, extra)
        with pytest.raises(configurator.ConfigError, match=message):
            sweep.main([path, *toy_args(data_dir), "--dry_run=True"])
        assert not os.path.exists(os.path.join(suite_dir, "suite.json"))
    path, _ = write_gate_suite(tmp_path, "clash", "variants['gated-flops'] = variants['gated']\nequal_flops_runs = True\n")
    with pytest.raises(configurator.ConfigError, match="^the run 'gated-flops-seed1' would be planned twice"):
        sweep.main([path, *toy_args(data_dir, "--max_iters=16", "--lr_decay_iters=16"), "--dry_run=True"])


def test_plan_names_a_missing_dataset_and_goes_on_where_a_run_would_refuse_it(tmp_path, capsys):
    """Issue 60: a plan made before the data is prepared prints the prepare command in one line and still
    plans; the sweep itself refuses the runs with the same line before any starts."""
    path, _ = write_growing_suite(tmp_path, [1, 2])
    unprepared = toy_args(str(tmp_path / "no-data"))
    runs = sweep.main([path, *unprepared, "--plan", "--measure_step=False"])
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("data: ")]
    assert len(runs) == 4 and len(lines) == 1
    assert "run base-seed1: " in lines[0] and "train.bin not found: prepare the dataset first with " \
        "`python data/toy/prepare.py`" in lines[0]
    with pytest.raises(configurator.ConfigError, match="prepare the dataset first with `python data/toy/prepare.py`"):
        sweep.main([path, *unprepared], launch=written_runs([]))
    sweep.main([path, *toy_args(str(tmp_path / "no-data"), "--dataset=shakespeare_char"), "--plan",
                "--measure_step=False"])
    assert "`python data/shakespeare/prepare.py --tokenizer=char`" in capsys.readouterr().out


def test_plan_without_a_pilot_times_each_variant_once_and_sums_its_runs_over_the_slots(data_dir, tmp_path, capsys):
    """A suite's time from each variant's step (an injected timer: base 0.5 s, other 1.5 s) x its iterations:
    3 seeds x 4 iterations x (0.5 + 1.5) s = 24 s over 2 CPU slots = 12 s; a forked suite's branch counts
    only the iterations after its trunk's."""
    path, _ = write_growing_suite(tmp_path, [1, 2, 3])
    timed = []

    def step_timer(cfg, threads):
        timed.append((cfg["learning_rate"], threads))
        return 0.5 if cfg["learning_rate"] == 1e-3 else 1.5

    sweep.main([path, *toy_args(data_dir), "--plan", "--cpu_runs=2"], step_timer=step_timer)
    assert sorted(timed) == [(1e-3, max(1, (os.cpu_count() or 1) // 2)), (2e-3, max(1, (os.cpu_count() or 1) // 2))]
    assert "time: about 0.2 min for 6 runs, 2 at a time" in capsys.readouterr().out
    # forked: 3 trunks of 4 iterations, 6 branches of the last 6
    forked, _ = write_gate_suite(tmp_path, "forked", "fork_at = 4\nfork_cold_starts = ['gated']\n")
    spec, _ = sweep.parse_args([forked, *toy_args(data_dir, "--max_iters=10", "--lr_decay_iters=10")])
    estimate = sweep.measured_plan_time(sweep.plan_runs(spec), 1, ["cpu:3#0"], lambda cfg, threads: 1.0)
    assert estimate == dict(code="measured", runs=9, slots=1, threads=3, step_s={"base": 1.0, "gated": 1.0}, train_s=3 * 4 + 6 * 6,
                            wall_s=48.0)
    assert sweep.measured_plan_time(sweep.plan_runs(spec), 2, ["0,1"], step_timer) == dict(code="several_processes",
                                                                                           nproc=2)
    spec, _ = sweep.parse_args([path, *toy_args(data_dir, "--n_embd=4096", "--device=cpu")])  # 4.6e11 FLOPs a micro-batch
    too_large = sweep.measured_plan_time(sweep.plan_runs(spec), 1, ["cpu:1#0"], step_timer)
    assert too_large["code"] == "too_large_for_cpu" and too_large["flops"] > sweep.CPU_MEASURE_FLOPS
    assert "time: not measured" in render.measured_time_line(too_large) and len(timed) == 2


def test_plan_measures_no_step_with_a_pilot_finished_runs_or_measure_step_false(data_dir, tmp_path, capsys):
    path, suite_dir = write_growing_suite(tmp_path, [1, 2])
    refuse = lambda cfg, threads: pytest.fail("a step was measured")
    sweep.main([path, *toy_args(data_dir), "--plan", "--measure_step=False"], step_timer=refuse)
    sweep.main([path, *toy_args(data_dir)], launch=written_runs([]))
    sweep.main([path, *toy_args(data_dir), "--plan"], step_timer=refuse)  # its own runs time a seed
    other, _ = write_growing_suite(tmp_path / "other", [3, 4]) if (tmp_path / "other").mkdir() is None else None
    sweep.main([other, *toy_args(data_dir), "--plan", f"--pilot={suite_dir}"], step_timer=refuse)
    assert "time: about" not in capsys.readouterr().out


def test_a_measured_step_is_a_real_positive_time_of_the_configured_model(data_dir, tmp_path):
    path, _ = write_growing_suite(tmp_path, [1])
    spec, _ = sweep.parse_args([path, *toy_args(data_dir)])
    estimate = sweep.measured_plan_time(sweep.plan_runs(spec), 1, ["cpu:1#0"])
    assert set(estimate["step_s"]) == {"base", "other"} and all(s > 0 for s in estimate["step_s"].values())
    assert estimate["train_s"] == pytest.approx(4 * sum(estimate["step_s"].values()))
    assert "not a pilot: evaluation and start-up not counted" in render.measured_time_line(estimate)
