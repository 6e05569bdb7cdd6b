"""Issue 61 (faults survived, round six), outside the training loop: each drill as the operator ran it on
a tiny RA recipe (2 layers x 32 wide, 40 steps), and its outcome: one line, before anything is written,
nothing lost, no hang. Training is replaced by run directories written as train.py writes them (config.json
from the arguments and the recipe file as it reads then, log.jsonl) unless a drill needs a real process."""
import json
import math
import os
import re
import signal
import subprocess
import sys

import pytest

import configurator
import rundir
import runtime
import sweep
from ablation import compare, render, suites
from helpers import REPO, run_script, toy_args, wait_for, write_suite
from tools import tune_lr

RECIPE = "# the tiny RA recipe\nlearning_rate = 0.005\nmin_lr = 0.0005\nmax_iters = 40\nn_layer = 2\nn_embd = 32\nn_head = 2\nwarmup_iters = 4\n"


def bowl(lr, seed):
    return 2.0 + 0.05 * math.log(lr / 1e-2) ** 2 + 0.01 * (seed % 3)


def write_run(out, cfg, value):
    """A run directory as train.py leaves it: its config, and a log ending in `end` (or `diverged`)."""
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f)
    with open(os.path.join(out, "log.jsonl"), "w") as f:
        f.write(json.dumps(dict(event="eval", iter=0, tokens=0, val_loss=4.0)) + "\n")
        if math.isfinite(value):
            f.write(json.dumps(dict(event="eval", iter=1, tokens=1000, val_loss=value)) + "\n")
            f.write(json.dumps(dict(event="end", iter=1, tokens=1000, stop_reason="max_iters")) + "\n")
        else:
            f.write(json.dumps(dict(event="diverged", iter=1, loss="nan")) + "\n")


@pytest.fixture
def trainer(monkeypatch):
    """tune_lr's runs written from the bowl (`value` replaceable), the recipe read as each run starts; a
    `during` hook runs after each run (the operator editing the recipe while the grid runs)."""
    state = dict(started=[], value=bowl, during=lambda n: None)

    def run_missing(jobs, metric, slots):
        for argv, out, _ in jobs:
            if tune_lr.final_value(out, metric) is not None:
                continue
            cfg = configurator.apply_config(runtime.DEFAULTS, argv)
            state["started"].append(out)
            write_run(out, cfg, state["value"](cfg["learning_rate"], cfg["seed"]))
            state["during"](len(state["started"]))

    monkeypatch.setattr(tune_lr, "run_missing", run_missing)
    return state


def tiny_suite(tmp_path, extra=""):
    recipe = tmp_path / "recipe.py"
    recipe.write_text(RECIPE)
    suite = tmp_path / "suite_ra.py"
    suite.write_text("variants = {'baseline': {'config': 'recipe.py', 'model_type': 'ra'},\n"
                     "            'other': {'config': 'recipe.py', 'model_type': 'ra', 'ra_pattern': 'all'}}\n"
                     "baseline = 'baseline'\nseeds = [1, 2]\nmetric = 'val_loss'\nmin_effect = 0.01\n"
                     f"allowed = ['ra_pattern']\n{extra}")
    return str(suite), str(recipe)


def tune(tmp_path, *extra):
    suite, recipe = tiny_suite(tmp_path) if not (tmp_path / "suite_ra.py").exists() else \
        (str(tmp_path / "suite_ra.py"), str(tmp_path / "recipe.py"))
    return tune_lr.main([suite, f"--sweep_dir={tmp_path / 'runs'}", f"--out={tmp_path / 'out'}", "--variants=False",
                         *extra])


def one_line(text):
    lines = [line for line in text.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), text
    return lines[0]


# ----------------------------------------------------------------------------- hangs

def test_cpu_runs_minus_one_is_one_line_before_anything_is_written_never_a_hang(data_dir, tmp_path, capsys):
    suite, _ = tiny_suite(tmp_path, f"suite_dir = {str(tmp_path / 'out-suite')!r}\n")
    code, stderr = run_script(capsys, "sweep.py", suite, *toy_args(data_dir), "--cpu_runs=-1")
    assert code == 1 and "--cpu_runs=-1" in one_line(stderr)
    assert not os.path.exists(tmp_path / "out-suite")  # no suite.json, no directory
    code, stderr = run_script(capsys, "tools/tune_lr.py", suite, f"--sweep_dir={tmp_path / 'runs'}", "--cpu_runs=-1")
    assert code == 1 and "--cpu_runs=-1" in one_line(stderr)
    assert not os.path.exists(tmp_path / "runs")


def test_cpu_runs_zero_in_tune_lr_means_one_per_core_as_in_sweep(tmp_path, trainer):
    assert tune(tmp_path, "--cpu_runs=0") == 0  # was a ZeroDivisionError


# ----------------------------------------------------------------------------- tune_lr: wrong results

def test_a_recipe_changed_since_the_runs_is_refused_not_tuned_from_the_old_runs(tmp_path, trainer):
    assert tune(tmp_path) == 0
    before = open(tmp_path / "out" / "tuning.json").read()
    (tmp_path / "recipe.py").write_text(RECIPE.replace("max_iters = 40", "max_iters = 80"))
    count = len(trainer["started"])
    with pytest.raises(configurator.ConfigError, match=r"trained with another recipe .*max_iters=40 there, 80 in the recipe"):
        tune(tmp_path)
    assert len(trainer["started"]) == count and open(tmp_path / "out" / "tuning.json").read() == before


def test_a_recipe_edited_while_the_grid_runs_is_never_pooled_or_written(tmp_path, trainer):
    _, recipe = tiny_suite(tmp_path)
    edit = lambda n: n == 2 and open(recipe, "w").write(RECIPE.replace("max_iters = 40", "max_iters = 80"))
    trainer["during"] = edit  # after the first rate's two seeds
    with pytest.raises(configurator.ConfigError, match="max_iters=80 there, 40 in the recipe"):
        tune(tmp_path, f"--write={recipe}")
    assert "lr_tuning" not in open(recipe).read() and not os.path.exists(tmp_path / "out" / "tuning.json")


def test_every_rate_diverged_leaves_the_recipe_unchanged(tmp_path, trainer, capsys):
    trainer["value"] = lambda lr, seed: math.inf
    _, recipe = tiny_suite(tmp_path)
    code = tune(tmp_path, "--factors=100000,200000,400000", "--max_points=3", f"--write={recipe}")
    assert code == 1 and open(recipe).read() == RECIPE
    assert "left unchanged: the best rate is not finite (every rate diverged)" in capsys.readouterr().err


def test_rates_that_share_a_directory_name_are_refused_before_any_run(tmp_path, trainer):
    with pytest.raises(configurator.ConfigError, match="share a run directory name"):
        tune(tmp_path, "--factors=1,1.001,1.002", "--step=1.001")
    assert trainer["started"] == [] and not os.path.exists(tmp_path / "runs")


def test_a_second_tuning_on_one_sweep_dir_is_refused(tmp_path, trainer):
    tiny_suite(tmp_path)
    with rundir.out_dir_lock(str(tmp_path / "runs"), holder="sweep"):  # the first tuning, still running
        with pytest.raises(rundir.RunDirError, match=f"in use by another sweep \\(pid {os.getpid()}\\)"):
            tune(tmp_path)
    assert trainer["started"] == []


def test_a_diverged_rate_is_scored_inf_on_the_first_call_as_on_the_second(tmp_path, monkeypatch):
    """The real run_missing, with train.py replaced by a process that diverges (exit 1)."""
    class Diverges:
        def __init__(self, argv, **kwargs):
            cfg = configurator.apply_config(runtime.DEFAULTS, argv[2:])
            write_run(cfg["out_dir"], cfg, math.inf)
            self.returncode = 1

        def poll(self):
            return self.returncode

    monkeypatch.setattr(tune_lr.subprocess, "Popen", Diverges)
    monkeypatch.setattr(tune_lr.time, "sleep", lambda s: None)
    out = str(tmp_path / "r")
    planned = runtime.settle(configurator.apply_config(runtime.DEFAULTS, [f"--out_dir={out}", "--seed=901"]))
    tune_lr.run_missing([([f"--out_dir={out}", "--seed=901"], out, planned)], "val_loss", 1)  # no "failed"
    assert tune_lr.final_value(out, "val_loss") == math.inf


# ----------------------------------------------------------------------------- tune_lr: one line, first

@pytest.mark.parametrize("what", ["second_learning_rate", "out_file", "sweep_dir_file", "train_config"])
def test_tune_lr_refuses_bad_input_in_one_line_before_any_run(tmp_path, trainer, what):
    suite, recipe = tiny_suite(tmp_path)
    (tmp_path / "a_file").write_text("x")
    extra, message = {
        "second_learning_rate": ([f"--write={recipe}"], "must assign learning_rate exactly once"),
        "out_file": ([f"--out={tmp_path / 'a_file'}"], "--out=.*a file is in the way"),
        "sweep_dir_file": ([f"--sweep_dir={tmp_path / 'a_file'}"], "--sweep_dir=.*a file is in the way"),
        "train_config": ([], "is not a suite file")}[what]
    if what == "second_learning_rate":
        open(recipe, "a").write("learning_rate = 0.02\n")
    args = [recipe if what == "train_config" else suite, f"--sweep_dir={tmp_path / 'runs'}", *extra]
    with pytest.raises(configurator.ConfigError, match=message):
        tune_lr.main(args)
    assert trainer["started"] == []


def test_sigterm_to_tune_lr_stops_its_runs_with_a_checkpoint_and_the_restart_resumes_them(data_dir, tmp_path,
                                                                                         monkeypatch):
    """A real train.py child: SIGTERM to the tool reaches it once (it saves and exits 3), the tool ends in
    one line, and the same command resumes the run from its checkpoint (never a second training beside it)."""
    suite, recipe = tiny_suite(tmp_path)
    with open(recipe, "a") as f:  # the toy corpus, and a run long enough to be stopped in the middle
        f.write(f"data_dir = {data_dir!r}\ndataset = 'toy'\nvocab_size = 64\nn_head = 2\nblock_size = 16\n"
                f"batch_size = 4\ndtype = 'float32'\neval_iters = 2\neval_interval = 100000\nlog_interval = 1\n"
                f"max_iters = 100000\nlr_decay_iters = 50\n")
    runs = tmp_path / "runs"
    proc = subprocess.Popen([sys.executable, "tools/tune_lr.py", suite, f"--sweep_dir={runs}", "--cpu_runs=1",
                             "--variants=False"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, OMP_NUM_THREADS="1"))
    first = runs / "baseline-lr0.005-seed901"
    wait_for(lambda: any(e["event"] == "train" for e in rundir.read_events(str(first))), "the first run's steps")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM and "saved a checkpoint" in one_line(err)
    events = rundir.read_events(str(first))
    assert events[-1]["event"] == "end" and events[-1]["stop_reason"] == "signal"  # the child stopped, saved
    assert os.path.exists(first / "ckpt.pt")
    assert rundir.run_status(events) == "preempted"
    # the restart (train.py replaced by a recorder) accepts the real run's config.json as the frozen recipe's
    # and resumes it from its checkpoint, in its own directory, once
    launched = []

    class Records:
        def __init__(self, argv, **kwargs):
            launched.append(argv[2:])
            cfg = configurator.apply_config(runtime.DEFAULTS, argv[2:])
            write_run(cfg["out_dir"], cfg, bowl(cfg["learning_rate"], cfg["seed"]))

        def poll(self):
            return 0

    monkeypatch.setattr(tune_lr.subprocess, "Popen", Records)
    monkeypatch.setattr(tune_lr.time, "sleep", lambda s: None)
    tune_lr.main([suite, f"--sweep_dir={runs}", "--cpu_runs=1", "--variants=False"])
    resumed = [argv for argv in launched if f"--out_dir={first}" in argv]
    assert len(resumed) == 1 and resumed[0][-1] == "--init_from=resume"


# ----------------------------------------------------------------------------- reports and suites

def test_a_rate_other_than_the_recipes_tuned_one_is_called_untuned():
    line = "tuned by tools/tune_lr.py on 2026-12-01 at commit abc: baseline ... best 0.01 (bracketed)"
    report = dict(about=dict(learning_rate=0.003, lr_tuning=line))
    assert not render.is_tuned(report) and render.tuning_text(report).startswith(
        "**untuned**: the recipe's tuning found 0.01, but these runs train at 0.003")
    assert render.is_tuned(dict(about=dict(learning_rate=0.01, lr_tuning=line)))


def tuned_suite(tmp_path, trainer, data_dir):
    """A tuning of the tiny recipe, written into it, and a suite that declares it (the toy data's settings)."""
    suite, recipe = tiny_suite(tmp_path)
    assert tune(tmp_path, f"--write={recipe}") == 0
    return suite, recipe, json.load(open(tmp_path / "out" / "tuning.json"))


def declare(tmp_path, suite, tuning_path):
    text = open(suite).read().replace("seeds = [1, 2]", "seeds = [1, 2]\n"
                                      f"tuning = {tuning_path!r}\nsuite_dir = {str(tmp_path / 'out-s')!r}")
    open(suite, "w").write(text)


def dry_run(suite, data_dir):
    return sweep.main([suite, "--dry_run=True"])  # the recipe as tuned: no overrides


def test_a_hand_edited_tuning_json_is_refused(tmp_path, trainer, data_dir):
    suite, _, result = tuned_suite(tmp_path, trainer, data_dir)
    declare(tmp_path, suite, str(tmp_path / "out" / "tuning.json"))
    dry_run(suite, data_dir)  # the tuning as written passes
    result["best_lr"] *= 2
    json.dump(result, open(tmp_path / "out" / "tuning.json", "w"))
    with pytest.raises(configurator.ConfigError, match="is not the best of its own grid .*the file was edited"):
        dry_run(suite, data_dir)


def test_another_recipes_tuning_is_refused_even_at_the_same_rate(tmp_path, trainer, data_dir):
    suite, recipe, _ = tuned_suite(tmp_path, trainer, data_dir)
    declare(tmp_path, suite, str(tmp_path / "out" / "tuning.json"))
    open(recipe, "a").write("max_iters = 80\n")  # another budget; the rate is still the tuned one
    with pytest.raises(configurator.ConfigError, match="was run on another recipe"):
        dry_run(suite, data_dir)


@pytest.mark.parametrize("line, message", [("allowed = 'qk_norm'", r"allowed='qk_norm': a list of the keys"),
                                           ("tuning = 0.012", "tuning=0.012: the path of the tuning.json"),
                                           ("tuning = True", "tuning=True: the path of the tuning.json")])
def test_allowed_and_tuning_of_the_wrong_type_are_one_line(tmp_path, line, message):
    namespace = dict(variants={"base": {}, "other": {"qk_norm": True}}, baseline="base", seeds=[1, 2],
                     metric="val_loss", allowed=["qk_norm"])
    key, value = line.split(" = ")
    namespace[key] = eval(value)
    with pytest.raises(configurator.ConfigError, match=message):
        suites.read_suite(namespace, "s", str(tmp_path), runtime.DEFAULTS)


def test_a_copied_seed_is_a_measurement_problem_not_a_second_seed(tmp_path):
    """seed 1's directory copied as seed 2 (its config says seed 1), and seed 2's record copied from seed 1
    (the same initial weights and batches): both named, and no verdict read from them."""
    def run(variant, seed, value, config_seed=None, facts_seed=None):
        return dict(out_dir=f"{variant}-seed{seed}", config=dict(seed=config_seed or seed),
                    info=dict(facts=dict(data_order=f"o{facts_seed or seed}",
                                         init_weights={"wte": [[4, 2], f"w{variant}{facts_seed or seed}"]}),
                              code_versions=["x"]),
                    events=[dict(event="eval", tokens=1000, iter=1, val_loss=value),
                            dict(event="end", tokens=1000, iter=1)])
    runs = {("base", 1): run("base", 1, 2.0), ("base", 2): run("base", 2, 2.0, config_seed=1),
            ("base", 3): run("base", 3, 2.1), ("other", 1): run("other", 1, 2.05),
            ("other", 2): run("other", 2, 2.05, facts_seed=1), ("other", 3): run("other", 3, 2.15)}
    suite = dict(name="s", metric="val_loss", baseline="base", allowed=[], min_effect=0.01,
                 variants={"base": [1, 2, 3], "other": [1, 2, 3]})
    report = compare.compare(suite, runs)
    codes = {(p["code"], p["run"]) for p in report["measurement_problems"]}
    assert codes == {("seed_mismatch", "base-seed2"), ("duplicate_seed", "other-seed2")}
    assert report["variants"]["other"]["p_holm"] is None  # no verdict from copies
    words = [render.measurement_text(p) for p in report["measurement_problems"]]
    assert any("filed as seed 2 but its config.json says seed 1" in w for w in words)
    assert any("the same weights on the same batches as other-seed1" in w for w in words)


def test_a_val_loss_logged_as_null_is_plotted_without_it_and_named_non_finite(tmp_path):
    import report as report_script
    suite_dir = tmp_path / "s"
    os.makedirs(suite_dir)
    json.dump(dict(name="s", metric="val_loss", baseline="base", allowed=["qk_norm"], seeds=[1, 2],
                   runs={f"{v}-seed{s}": [v, s] for v in ("base", "other") for s in (1, 2)}),
              open(suite_dir / "suite.json", "w"))
    for v in ("base", "other"):
        for s in (1, 2):
            out = suite_dir / f"{v}-seed{s}"
            write_run(str(out), dict(runtime.DEFAULTS, seed=s, qk_norm=v == "other", out_dir=str(out)), 2.0 + 0.01 * s)
    log = suite_dir / "other-seed2" / "log.jsonl"
    log.write_text(log.read_text().replace('"val_loss": 2.02', '"val_loss": null'))
    report_script.main([str(suite_dir)])
    text = open(suite_dir / "report.md").read()
    assert "val_loss is null at 1000 tokens" in text and os.path.exists(suite_dir / "metric_vs_tokens.png")


def test_a_run_deleted_after_a_look_is_missing_not_not_run(tmp_path):
    suite_dir = tmp_path / "s"
    os.makedirs(suite_dir)
    json.dump(dict(name="s", metric="val_loss", baseline="base", allowed=[], seeds=[1, 2],
                   runs={f"{v}-seed{s}": [v, s] for v in ("base", "other") for s in (1, 2)}),
              open(suite_dir / "suite.json", "w"))
    suites.append_suite_record(str(suite_dir), dict(event="look", seeds=2))
    _, runs = suites.load_suite_dir(str(suite_dir))
    assert runs[("other", 2)]["not_started"].startswith("missing after a look: a report at 2 seeds read it")


def test_the_dry_run_lists_runs_in_the_order_they_are_launched(data_dir, tmp_path, capsys):
    path, _ = write_suite(tmp_path, {"base": {"learning_rate": 1e-3}, "other": {"learning_rate": 2e-3}},
                          ["learning_rate"], seeds=(1, 2))
    sweep.main([path, *toy_args(data_dir), "--dry_run=True"])
    listed = [line.split(":")[0].strip() for line in capsys.readouterr().out.splitlines()[1:]]
    assert listed == ["base-seed1", "other-seed1", "base-seed2", "other-seed2"]


def test_the_suites_header_quotes_each_arms_optimum_against_the_shared_rate_and_the_runs_commits(tmp_path, trainer):
    """What a suite declaring the tuning carries into its report's header: each arm's fitted optimum, whether
    its interval covers the shared rate, the effects at its own optimum and at that rate, and the runs' code."""
    suite, _ = tiny_suite(tmp_path)
    assert tune_lr.main([suite, f"--sweep_dir={tmp_path / 'runs'}", f"--out={tmp_path / 'out'}"]) == 0
    declare(tmp_path, suite, str(tmp_path / "out" / "tuning.json"))
    namespace = configurator.read_config_file(suite)
    header = suites.read_suite(namespace, "suite_ra", str(tmp_path), runtime.DEFAULTS)["tuning"]["summary"]
    # 5 rates (0.005, 0.01, 0.02 and the midpoints beside 0.01) for each arm, 3 seeds each; fake runs record no code
    assert "seeds 901, 902, 903 (3 per rate)" in header and "(its 30 runs at commit unknown)" in header
    # a noiseless bowl: each interval is its optimum, the shared rate itself (covered or not by rounding)
    assert re.search(r"against the shared rate 0\.01: baseline 0\.01 \[0\.01, 0\.01\] (covers|does NOT cover) it; "
                     r"other 0\.01 \[0\.01, 0\.01\] (covers|does NOT cover) it, effect \+0\.0000 \(se 0\.0000\) at "
                     r"its own optimum, \+0\.0000 \(se 0\.0000\) at the shared rate$", header)  # one bowl for both arms
