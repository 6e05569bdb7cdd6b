"""Ablation suites (sweep.py + ablation/compare.py + report.py): statistics against hand computations,
confounds refused and reported, A/A and positive-control verdicts, failed runs, rebuilt reports."""
import json
import math
import os
import re
import shutil

import numpy as np
import pytest
from scipy import stats as scipy_stats

import configurator
import report
import rundir
import runtime
import sweep
from ablation import compare, render, stats
from helpers import LR, in_process, suite_args, synthetic_run, toy_args, write_suite

T_975_DF2 = 4.302652729911275  # Student t quantile 0.975 with 2 degrees of freedom (tables)


def test_paired_test_matches_a_hand_computation():
    d = [0.1, 0.2, 0.3]  # mean 0.2, sd 0.1, standard error 0.1 / sqrt(3)
    test = stats.paired_test(d)
    se = 0.1 / math.sqrt(3)
    assert test["n"] == 3 and test["mean"] == pytest.approx(0.2) and test["sd"] == pytest.approx(0.1)
    assert stats.interval(test, 0.95) == pytest.approx([0.2 - T_975_DF2 * se, 0.2 + T_975_DF2 * se])
    # two-sided p of t = 0.2 / se = 2 sqrt(3) with 2 df: the t(2) tail is 1/2 - t / (2 sqrt(t^2 + 2))
    t = 0.2 / se
    assert test["p"] == pytest.approx(2 * (0.5 - t / (2 * math.sqrt(t * t + 2))))
    for same in ([0.0, 0.0, 0.0], [1e-6, 1e-6, 1e-6]):  # equal runs, a constant offset: no p
        assert stats.paired_test(same) == dict(n=3, mean=same[0], sd=0.0, p=None, deterministic=True, diffs=same)
    assert stats.paired_test([0.5])["p"] is None  # one seed: no test


def test_clopper_pearson_interval_matches_its_closed_form():
    # 0 of n: upper bound 1 - (alpha/2)^(1/n); n of n: lower bound (alpha/2)^(1/n)
    assert compare.binomial_interval(0, 10) == pytest.approx([0.0, 1 - 0.025 ** 0.1])
    assert compare.binomial_interval(10, 10) == pytest.approx([0.025 ** 0.1, 1.0])
    assert compare.binomial_interval(10, 10, 0.99) == pytest.approx([0.005 ** 0.1, 1.0])


def test_verdicts():
    def v(diffs, goal="lower", min_effect=0.05, others=()):
        decision = stats.judge([stats.paired_test(d) for d in (diffs, *others)], 0.05, goal, min_effect,
                               dict(seeds_needed=12))[0]
        return decision["verdict"], {r["code"]: r for r in decision["reasons"]}
    assert v([-0.3, -0.2, -0.25])[0] == "better"
    assert v([0.3, 0.2, 0.25])[0] == "worse" and v([0.3, 0.2, 0.25], "higher")[0] == "better"
    # Holm decides, not the raw p: p = 0.0088 alone is worse, beside three nulls (k = 4) it is inconclusive
    assert v([0.3, 0.2, 0.25], others=[[0.1, -0.1, 0.05]] * 3)[0] == "inconclusive"
    word, why = v([0.001, -0.002, 0.0005, 0.0015, -0.001], min_effect=0.05)
    assert word == "equivalent" and set(why) == {"equivalent"}
    assert why["equivalent"]["min_effect"] == 0.05 and why["equivalent"]["confidence"] == pytest.approx(0.95)
    word, why = v([-0.02, 0.05, 0.01])
    assert word == "inconclusive" and list(why) == ["holm_holds_zero", "reaches_margin", "seed_plan"]
    assert why["seed_plan"] == dict(code="seed_plan", seeds_needed=12, min_effect=0.05)
    assert why["holm_holds_zero"]["interval"][0] < 0 < why["holm_holds_zero"]["interval"][1]
    assert v([0.1, 0.3]) == ("too few seeds", {"too_few_seeds": dict(code="too_few_seeds", n=2, needed=3)})
    assert v([1e-6] * 3)[0] == "deterministic" and not v([1e-6] * 3)[1]["deterministic"]["exact"]
    assert v([0.0] * 3)[1]["deterministic"]["exact"]
    assert compare.blocked_verdict({}, [dict(code="no_paired_seed")], 3)[0] == "incomplete"
    assert compare.blocked_verdict({"batch_size": (8, 4)}, [], 3) == (
        "not comparable", [dict(code="confounds", confounds={"batch_size": [8, 4]})])


def test_aa_suite_and_positive_control(data_dir, tmp_path, capsys):
    """gpt against ra with ra_pattern='none' (the same network: bitwise-equal runs, deterministic) and a
    learning rate 10x too low (worse), three paired seeds each."""
    variants = {"base": {"model_type": "ra", **LR}, "same": {"model_type": "gpt", **LR},
                "lr_low": {"model_type": "ra", "learning_rate": 3e-4, "min_lr": 3e-5}}
    path, suite_dir = write_suite(tmp_path, variants, ["model_type", "learning_rate", "min_lr"])
    calls = []
    sweep.main(suite_args(data_dir, path), launch=in_process(calls))
    assert len(calls) == 9
    result = json.load(open(os.path.join(suite_dir, "report.json")))
    # iterations x batch x block x accumulation: every run's last evaluation
    assert result["compared_at_tokens"] == 16 * 12 * 16 * 2 and result["metric"] == "val_loss"
    same, low = result["variants"]["same"], result["variants"]["lr_low"]
    assert same["verdict"] == "deterministic" and same["differences"] == [0.0, 0.0, 0.0], same
    assert low["verdict"] == "worse" and low["interval"][0] > 0 and low["p_holm"] < 0.05, low
    assert result["comparisons"] == 2 and result["level"] == 0.025
    for entry in (same, low):
        assert entry["n"] == 3 and entry["paired_seeds"] == [1, 2, 3] and not entry["confounds"]
        assert entry["pairing"] == [dict(seed=s, paired=True, problems=[]) for s in (1, 2, 3)]
    # the paired difference is exactly the per-seed gap of the logged final evaluations
    evals = lambda run: [e for e in rundir.read_events(os.path.join(suite_dir, run)) if e["event"] == "eval"]
    gaps = [evals(f"lr_low-seed{s}")[-1]["val_loss"] - evals(f"base-seed{s}")[-1]["val_loss"] for s in (1, 2, 3)]
    assert low["differences"] == pytest.approx(gaps) and low["diff_mean"] == pytest.approx(np.mean(gaps))
    on_disk = json.load(open(os.path.join(suite_dir, "report.json")))
    assert on_disk["variants"]["lr_low"]["verdict"] == "worse" and on_disk["variants"]["lr_low"]["n"] == 3
    assert on_disk["compared_at_tokens"] == 6144
    for png in ("metric_vs_tokens.png", "paired_differences.png"):
        assert os.path.getsize(os.path.join(suite_dir, png)) > 1000
    # the runs share a W&B group; each run directory can repeat itself
    cfg = json.load(open(os.path.join(suite_dir, "same-seed2", "config.json")))
    assert cfg["wandb_group"] == "suite_toy" and cfg["seed"] == 2
    info = json.load(open(os.path.join(suite_dir, "same-seed2", "run_info.json")))
    assert "train.py" in info["start"]["command"] and info["repeat"].endswith(info["start"]["command"])
    assert info["facts"]["model_class"] == "GPT" and info["start"]["packages"]["torch"]

    # Rebuilt from disk alone: the same numbers.
    for name in ("report.md", "report.json"):
        os.remove(os.path.join(suite_dir, name))
    report.main([suite_dir])
    assert json.load(open(os.path.join(suite_dir, "report.json"))) == result
    with pytest.raises(configurator.ConfigError, match="declared before its runs"):
        report.main([suite_dir, "--metric=train_loss"])
    # ... and from run directories that no suite produced
    dirs = [os.path.join(suite_dir, f"{v}-seed{s}") for v in ("base", "lr_low") for s in (1, 2, 3)]
    report.main([*dirs, f"--out={tmp_path / 'adhoc'}"])
    adhoc = json.load(open(tmp_path / "adhoc" / "report.json"))
    assert adhoc["baseline"] == "base" and adhoc["variants"]["lr_low"]["verdict"] == "worse"
    assert adhoc["comparisons"] == 1  # two variants here: one comparison, so a wider level than the suite's
    assert adhoc["variants"]["lr_low"]["diff_mean"] == pytest.approx(low["diff_mean"])
    assert not adhoc["allowed_declared"] and adhoc["allowed"] == ["learning_rate", "min_lr"]
    # The seed planner reads this suite as a pilot with the analysis it declared (blocked, the default): each
    # arm's own sd, the analysis's own df and critical value, the seeds 0.01 would need.
    assert result["analysis"] == "blocked" and result["blocked_analysis"]["seeds"] == [1, 2, 3]
    capsys.readouterr()
    sweep.main([*suite_args(data_dir, path), "--plan=True", f"--pilot={suite_dir}"], launch=in_process(calls))
    planned = capsys.readouterr().out
    plan = result["plan"]
    assert plan["analysis"] == "blocked" and f"baseline: sd {plan['baseline_sd']:.4g}" in planned
    for name, own in plan["per_variant"].items():
        assert f"{name}: sd {own['sd']:.4g}, bound {own['sd_upper']:.4g}" in planned
    assert "2 many-to-one comparison(s)" in planned and f"the noisiest: {plan['noisiest']}" in planned
    assert (f"needs {plan['seeds_needed']} seeds" if plan["seeds_needed"] else "more seeds than") in planned
    assert "warning: the pilot ran seeds" not in planned  # its own runs: the suite itself, no other pilot
    # Issue 40: another suite planned from this one as its pilot is told to take disjoint seeds: seeds the
    # pilot ran would be the pilot's own runs, bit for bit, a look before its report
    sweep.main([*suite_args(data_dir, path), "--plan=True", f"--pilot={suite_dir}", "--budget=30m",
                f"--sweep_dir={tmp_path / 'next'}"], launch=in_process(calls))
    planned = capsys.readouterr().out
    assert "warning: the pilot ran seeds [1, 2, 3], which are also this suite's" in planned
    assert "so: seeds = list(range(4, " in planned
    assert len(calls) == 9  # planning runs nothing
    # The metric is frozen by the first run.
    text = open(path).read().replace("metric = 'val_loss'", "metric = 'train_loss'")
    open(path, "w").write(text)
    with pytest.raises(configurator.ConfigError, match="declared metric='val_loss' before its runs"):
        sweep.main(suite_args(data_dir, path), launch=in_process(calls))


def test_hidden_confounds_are_refused_and_reported(data_dir, tmp_path):
    """A variant whose config file silently changes the batch size is refused before any run; run
    anyway, it is reported as not comparable with both values. A dataset re-prepared under the same
    name between runs is caught from the measured fingerprint."""
    sneaky = tmp_path / "train_sneaky.py"
    sneaky.write_text("learning_rate = 1e-3\nbatch_size = 2\n")  # declared: learning_rate only
    variants = {"base": LR, "sneaky": {"config": str(sneaky), "min_lr": 3e-4}}
    path, suite_dir = write_suite(tmp_path, variants, ["learning_rate"], seeds=(1,))  # a confound needs no spread
    calls = []
    with pytest.raises(configurator.ConfigError, match="sneaky: batch_size = 2 vs baseline 12"):
        sweep.main(suite_args(data_dir, path), launch=in_process(calls))
    assert calls == [] and not os.path.exists(suite_dir)
    sweep.main([*suite_args(data_dir, path), "--allow_confounds=True"], launch=in_process(calls))
    entry = json.load(open(os.path.join(suite_dir, "report.json")))["variants"]["sneaky"]
    assert entry["verdict"] == "not comparable" and entry["confounds"]["batch_size"] == [2, 12]

    # Another dataset behind the same data_dir: only the measured facts can tell.
    data = tmp_path / "data"
    shutil.copytree(data_dir, data)
    variants = {"base": LR, "later": dict(LR, learning_rate=1e-3)}
    path, suite_dir = write_suite(tmp_path, variants, ["learning_rate"], seeds=(1,), name="suite_data")
    args = [a.replace(f"--data_dir={data_dir}", f"--data_dir={data}") for a in suite_args(data_dir, path)]
    order = []

    def launch(argv, gpu, log_path):
        if "later-seed1" in argv[-3] + argv[-2]:  # re-prepare the data before the variant runs
            tokens = np.fromfile(data / "val.bin", dtype=np.uint16)
            np.roll(tokens, 7).tofile(data / "val.bin")
        return in_process(order)(argv, gpu, log_path)
    sweep.main(args, launch=launch)
    entry = json.load(open(os.path.join(suite_dir, "report.json")))["variants"]["later"]
    measurement = json.load(open(os.path.join(suite_dir, "report.json")))["measurement_problems"]
    assert entry["verdict"] == "not comparable" and [m["key"] for m in measurement] == [
        "dataset_fingerprint", "eval_windows"] and (measurement[0]["run"], measurement[0]["other"]) == (
        "later-seed1", "base-seed1")


def test_a_failed_run_is_shown_and_makes_the_verdict_incomplete(data_dir, tmp_path):
    variants = {"base": LR, "other": dict(LR, learning_rate=1e-3)}
    path, suite_dir = write_suite(tmp_path, variants, ["learning_rate"], seeds=(1, 2))
    calls = []
    with pytest.raises(RuntimeError, match="1 runs failed: other-seed2"):
        sweep.main(suite_args(data_dir, path), launch=in_process(calls, fail=("other-seed2",)))
    entry = json.load(open(os.path.join(suite_dir, "report.json")))["variants"]["other"]
    assert entry["runs"]["seed2"]["status"] == "failed" and entry["verdict"] == "incomplete"
    assert entry["reasons"][0] == dict(code="unfinished", unfinished=[dict(variant=True, seed=2, status="failed")],
                                       non_finite=[], metric="val_loss") and entry["n"] == 1


def test_pairing_check_names_weights_that_start_differently():
    facts = lambda order, w: dict(info=dict(facts=dict(data_order=order, init_weights=w)))
    base = facts("a", {"wte": [[4, 2], "x"], "h.0": [[2, 2], "y"], "extra": [[1], "z"]})
    assert compare.pairing(facts("a", {"wte": [[4, 2], "x"], "h.0": [[2, 2], "y"]}), base, []) == []
    problems = compare.pairing(facts("b", {"wte": [[4, 2], "x"], "h.0": [[2, 2], "q"]}), base, [])
    assert problems == [dict(code="data_order"), dict(code="init_weights", differ=1, shared=2, example="h.0")]


def test_suite_declaration_errors_are_one_line(tmp_path):
    bad = tmp_path / "suite_bad.py"
    bad.write_text("variants = {'a': {}}\nbaseline = 'b'\nseeds = [1]\nmetric = 'val_loss'\nallowed = []\n")
    with pytest.raises(configurator.ConfigError, match="baseline='b' is not one of the variants"):
        sweep.main([str(bad), "--dry_run=True"])
    bad.write_text("variants = {'a': {}}\nbaseline = 'a'\nseeds = [1]\nmetric = 'accuracy'\nallowed = []\n")
    with pytest.raises(configurator.ConfigError, match="metric='accuracy'"):
        sweep.main([str(bad), "--dry_run=True"])


SUITES = sorted(os.path.join(runtime.REPO_DIR, "suites", f) for f in os.listdir(os.path.join(runtime.REPO_DIR, "suites")))
OVERLAID = ("pruning", "ln_warmup", "attn_impl", "lr_batch", "optimizers")  # CPU twins through the overlay


@pytest.mark.parametrize("path", SUITES, ids=os.path.basename)
def test_every_shipped_suite_plans_without_confounds(path):
    """Each suite (and its CPU twin) resolves every run's config and passes the confound check."""
    overlay = [os.path.join(runtime.REPO_DIR, "config", "small_shakespeare.py")] \
        if os.path.basename(path)[:-3] in OVERLAID else []
    for extra in ([[]] + [overlay] if overlay else [[]]):
        runs = sweep.main([path, *extra, "--dry_run=True"])
        seeds = {p["seed"] for _, p, _ in runs}
        sizes = {p.get("size") for _, p, _ in runs}  # a ladder runs every variant x seed at each size
        apart = [p for _, p, _ in runs if p.get("bridge") or "lr_check" in p]  # from scratch, outside the family
        branches = [p for _, p, _ in runs if not p.get("trunk") and p not in apart]  # a fork suite adds one trunk per seed and size
        trunks = len(runs) - len(branches) - len(apart)
        assert trunks in (0, len(seeds) * len(sizes)) and all(p.get("after") for p in branches) == bool(trunks)
        assert len(seeds) >= 3 and len(branches) == len({p["variant"] for p in branches}) * len(seeds) * len(sizes)


def test_time_limited_runs_are_compared_at_equal_tokens_with_every_plot(tmp_path):
    """Runs that end at different token counts are compared at the largest count all of them
    evaluated at; a 2 x 2 grid of two numeric keys gets a heatmap; syncs and sparsity get theirs."""
    runs, variants = {}, {}
    for i, (lr, batch) in enumerate([(1e-3, 8), (1e-3, 16), (3e-3, 8), (3e-3, 16)]):
        name = f"lr{lr:g}_b{batch}"
        variants[name] = [1, 2]
        for seed in (1, 2):
            shift = 0.1 * i + 0.01 * seed
            runs[(name, seed)] = synthetic_run(name, seed, lr, batch, lambda t, s=shift: 3 - t / 1000 + s,
                                               final_tokens=300 + 100 * i + seed * 50, hellaswag_right=30 + i)
    suite = dict(name="grid", metric="val_loss", baseline="lr0.001_b8", allowed=["learning_rate", "batch_size"],
                 variants=variants)
    result = compare.compare(suite, runs)
    assert result["compared_at_tokens"] == 300  # the shortest run ended at 350 tokens, evaluated at 300
    v = result["variants"]["lr0.003_b16"]
    assert v["differences"] == pytest.approx([0.3, 0.3]) and v["verdict"] == "incomplete"  # no run record
    missing = next(r for r in v["reasons"] if r["code"] == "records_missing")
    assert missing["records"] and all(r.endswith("(run_info.json)") for r in missing["records"])
    assert v["cost_ratio"]["tokens_per_sec"] == pytest.approx(0.5)  # its tokens / its step time: 100/16 vs 100/8
    h = v["hellaswag"]  # 33 of 100 in each of 2 seeds, pooled
    assert h["n"] == 200 and h["acc_norm"]["value"] == pytest.approx(0.33)
    assert h["acc_norm"]["interval"] == pytest.approx(compare.binomial_interval(66, 200, 1 - 0.05 / 3))
    assert not h["acc_norm"]["chance_inside"]  # 66/200: [0.265, 0.40]
    assert result["variants"]["lr0.001_b8"]["hellaswag"]["acc_norm"]["chance_inside"]  # 60/200 is not above chance
    path = render.write_report(result, runs, str(tmp_path))
    for png in ("metric_vs_tokens.png", "paired_differences.png", "syncs_vs_loss.png", "sparsity_vs_ppl.png",
                "heatmap.png"):
        assert os.path.getsize(tmp_path / png) > 1000, png
    assert path.endswith("report.md")
    finals = [t for t in result["final_tokens"].values() if t]
    assert result["compared_at_tokens"] == 300 and (min(finals), max(finals)) == (350, 700)


def test_a_suite_with_nproc_runs_each_variant_under_torchrun(data_dir, tmp_path):
    """nproc=2: every run is a 2-rank torchrun launch (the reduced-sync suites need ranks); the
    measured facts record the world size and the report compares the runs."""
    path, suite_dir = write_suite(tmp_path, {"base": {}, "spd": {"block_pattern": "spd"}}, ["block_pattern"],
                                  seeds=(1,), name="suite_ranks")
    with open(path, "a") as f:
        f.write("nproc = 2\n")
    sweep.main([path, *toy_args(data_dir, "--max_iters=2", "--lr_decay_iters=2", "--eval_interval=2",
                                "--warmup_iters=1"), "--learning_rate=1e-2", "--model_type=reduced_sync", "--tp_size=2",
                "--batch_size=2"])
    result = json.load(open(os.path.join(suite_dir, "report.json")))
    spd = result["variants"]["spd"]
    assert spd["verdict"] == "too few seeds" and spd["runs"]["seed1"]["status"] == "finished" and not spd["confounds"]
    info = json.load(open(os.path.join(suite_dir, "spd-seed1", "run_info.json")))
    assert info["facts"]["world_size"] == 2 and info["start"]["command"].startswith("torchrun --standalone "
                                                                                     "--nproc_per_node=2")
    syncs = [e["syncs_forward"] for e in rundir.read_events(os.path.join(suite_dir, "spd-seed1"))
             if e["event"] == "eval"]
    assert syncs and set(syncs) == {2}  # 2 spd layers, one all-reduce each


def write_run_dir(path, seed, lr, val_losses, facts):
    os.makedirs(path)
    cfg = dict(runtime.DEFAULTS, seed=seed, out_dir=str(path), learning_rate=lr)
    json.dump(cfg, open(os.path.join(path, "config.json"), "w"))
    json.dump(dict(facts=facts, resumes=[], code_versions=["x"]), open(os.path.join(path, "run_info.json"), "w"))
    with open(os.path.join(path, "log.jsonl"), "w") as f:
        for i, v in enumerate(val_losses):
            f.write(json.dumps(dict(event="eval", iter=i, tokens=1000 * i, val_loss=v)) + "\n")
        f.write(json.dumps(dict(event="end", iter=i, tokens=1000 * i, stop_reason="max_iters")) + "\n")


def test_a_report_names_every_damaged_file_and_draws_nothing_from_it(tmp_path):
    """A torn line in the middle of a log, a byte that is not UTF-8, a record with a NaN token count
    and a truncated run_info.json: each is named with what was done, and the variant whose facts are
    unreadable is incomplete, never "different"."""
    facts = dict(dataset_fingerprint="d", tokenizer="t", eval_windows="w", data_order="o", init_weights={})
    dirs = []
    for v, lr, shift in (("base", 1e-3, 0.0), ("other", 2e-3, 0.05)):
        for seed in (1, 2, 3):
            path = tmp_path / f"{v}-seed{seed}"
            write_run_dir(path, seed, lr, [3.0 + shift, 2.5 + shift + 0.01 * seed, 2.0 + shift + 0.01 * seed], facts)
            dirs.append(str(path))
    log = tmp_path / "other-seed1" / "log.jsonl"
    lines = log.read_bytes().splitlines(keepends=True)
    log.write_bytes(lines[0] + b'{"event": "ev' + b"\n" + b"\xff\xfe\n" + b'{"event": "eval", "iter": 9, "tokens": NaN}\n'
                    + b"".join(lines[1:]))
    (tmp_path / "other-seed2" / "run_info.json").write_text('{"facts": {"dataset_fing')
    report.main([*dirs, f"--out={tmp_path / 'out'}", "--min_effect=0.01"])
    result = json.load(open(tmp_path / "out" / "report.json"))
    assert result["damaged"] == [f"{tmp_path}/other-seed1/log.jsonl:2: not a whole JSON record: line skipped",
                                 f"{tmp_path}/other-seed1/log.jsonl:3: not UTF-8: line skipped",
                                 f"{tmp_path}/other-seed1/log.jsonl:4: a non-finite token or iteration count: line skipped",
                                 f"{tmp_path}/other-seed2/run_info.json is damaged (JSONDecodeError): read as missing"]
    assert result["compared_at_tokens"] == 2000  # the torn lines moved no comparison point
    other = result["variants"]["other"]
    assert other["verdict"] == "incomplete" and f"{tmp_path}/other-seed2 (run_info.json)" in next(
        r for r in other["reasons"] if r["code"] == "records_missing")["records"]
    assert not other["confounds"] and not result["measurement_problems"]  # missing is not different
    assert os.path.exists(tmp_path / "out" / "report.md")
    # Without a readable config.json a run cannot be placed in a variant: refused, naming the damage.
    (tmp_path / "base-seed3" / "config.json").write_text('{"seed": 3, "learn')
    with pytest.raises(configurator.ConfigError, match=re.escape(
            f"{tmp_path}/base-seed3/config.json is damaged (JSONDecodeError): read as missing: without its config")):
        report.main([*dirs, f"--out={tmp_path / 'out2'}", "--min_effect=0.01"])


def test_eval_iters_can_never_differ_ad_hoc_or_in_a_suite(tmp_path):
    facts = dict(dataset_fingerprint="d", tokenizer="t", eval_windows="w", data_order="o", init_weights={})
    dirs = []
    for v, lr in (("base", 1e-3), ("other", 2e-3)):
        for seed in (1, 2, 3):
            write_run_dir(tmp_path / f"{v}-seed{seed}", seed, lr, [3.0, 2.5 + 0.01 * seed + lr], facts)
            dirs.append(str(tmp_path / f"{v}-seed{seed}"))
    cfg_path = tmp_path / "other-seed3" / "config.json"
    cfg = json.load(open(cfg_path))
    json.dump(dict(cfg, eval_iters=cfg["eval_iters"] + 5), open(cfg_path, "w"))
    report.main([*dirs, f"--out={tmp_path / 'out'}", "--min_effect=0.01"])  # every difference "intended" ad hoc
    result = json.load(open(tmp_path / "out" / "report.json"))
    assert result["variants"]["other"]["verdict"] == "not comparable"
    assert result["measurement_problems"] == [dict(code="differs", key="eval_iters", run="other-seed3",
                                                   value=cfg["eval_iters"] + 5, other="base-seed1",
                                                   other_value=cfg["eval_iters"])]
    path, _ = write_suite(tmp_path, {"base": {}, "more": {"eval_iters": 40}}, ["eval_iters"], name="suite_eval")
    with pytest.raises(configurator.ConfigError, match=r"allowed names \['eval_iters'\]: these define how the metric"):
        sweep.parse_args([path])


def test_declared_looks_keep_the_family_wise_error_at_alpha_and_unplanned_looks_do_not():
    """Under a true null, looks at 3, 6, 10 and 20 seeds each tested at 0.05 claimed a difference 15% of
    the time. With the looks declared, each tested at the alpha spent there, at most 5%."""
    rng = np.random.default_rng(11)
    sims, looks = 4000, [3, 6, 10, 20]
    d = rng.normal(0.0, 1.0, size=(sims, looks[-1]))
    record, planned, naive = [], np.zeros(sims, bool), np.zeros(sims, bool)
    for n in looks:
        alpha, note = compare.sequential_alpha(dict(alpha=0.05, looks=looks, record=record), n)
        assert note["code"] == "planned_look" and note["number"] == looks.index(n) + 1 and note["spent"] == alpha
        t = d[:, :n].mean(axis=1) / (d[:, :n].std(axis=1, ddof=1) / math.sqrt(n))
        p = 2 * scipy_stats.t.sf(np.abs(t), n - 1)
        planned |= p < alpha
        naive |= p < 0.05
        record.append(dict(event="look", seeds=n))
    error = 3 * math.sqrt(0.05 * 0.95 / sims)
    assert planned.mean() <= 0.05 + error, planned.mean()
    assert naive.mean() > 0.1, naive.mean()
    alpha, note = compare.sequential_alpha(dict(alpha=0.05, record=record[:2]), 10)  # no plan: said, not hidden
    assert alpha == 0.05 and note["code"] == "unplanned_looks" and note["looks"] == [3, 6, 10]


def declared(tmp_path, **keys):
    """A suite file's declaration read as sweep.py reads it (ablation/suites.read_suite)."""
    from ablation import suites
    namespace = dict(variants={"base": {}, "a": {"learning_rate": 1e-3}, "b": {"learning_rate": 2e-3}},
                     baseline="base", seeds=[1, 2, 3], metric="val_loss", allowed=["learning_rate"], **keys)
    return suites.read_suite(namespace, "suite_declared", str(tmp_path), ["learning_rate"])


def test_a_suite_declares_its_analysis_before_its_runs_and_cannot_change_it(tmp_path):
    from ablation import suites
    with pytest.raises(configurator.ConfigError, match="analysis='pooled'.*one of"):
        declared(tmp_path, analysis="pooled")
    runs = [(f"{v}-seed{s}", dict(variant=v, seed=s), []) for v in ("base", "a", "b") for s in (1, 2, 3)]
    new = str(tmp_path / "new")
    suites.freeze_suite(declared(tmp_path), runs, new)  # a new suite: the blocked analysis, frozen
    assert json.load(open(os.path.join(new, "suite.json")))["analysis"] == "blocked" == stats.DEFAULT_ANALYSIS
    assert suites.load_suite_dir(new)[0]["analysis"] == "blocked"
    with pytest.raises(configurator.ConfigError, match="declared analysis='blocked' before its runs.*'paired'"):
        suites.check_declaration(declared(tmp_path, analysis="paired"), new)
    # a suite.json written before the key declared the paired analysis: it keeps it, resumes, and refuses a change
    old = str(tmp_path / "old")
    suites.freeze_suite(declared(tmp_path, analysis="paired"), runs, old)
    frozen = json.load(open(os.path.join(old, "suite.json")))
    del frozen["analysis"]
    json.dump(frozen, open(os.path.join(old, "suite.json"), "w"))
    assert suites.load_suite_dir(old)[0]["analysis"] == "paired"
    assert suites.check_declaration(declared(tmp_path), old) is not None  # the suite file unchanged: it resumes
    with pytest.raises(configurator.ConfigError, match="declared analysis='paired'.*without the key"):
        suites.check_declaration(declared(tmp_path, analysis="blocked"), old)


def test_the_blocked_report_says_its_analysis_and_decides_on_the_whole_tables_complete_seeds():
    rng = np.random.default_rng(4)
    values = {("base", s): 2.0 + 0.01 * rng.standard_normal() for s in range(1, 7)}
    values.update({("a", s): values[("base", s)] + 0.05 + 0.005 * rng.standard_normal() for s in range(1, 7)})
    values.update({("b", s): values[("base", s)] + 0.005 * rng.standard_normal() for s in range(1, 7)})
    report = {"baseline": "base", "measurement_problems": [], "alpha": 0.05, "goal": "lower", "min_effect": 0.01,
              "analysis": "blocked", "variants": {}}
    for v in ("base", "a", "b"):
        runs = {f"seed{s}": dict(value=None if (v, s) == ("b", 6) else values[(v, s)]) for s in range(1, 7)}
        report["variants"][v] = dict(runs=runs, blocked=None, confounds={}, test=None)
    names, seeds, table = compare.blocked_table(report)
    assert names == ["a", "b"] and seeds == [1, 2, 3, 4, 5] and table.shape == (3, 5)  # seed 6 lacks b: out
    report["blocked_analysis"] = dict(variants=names, seeds=seeds)
    compare.decide(report)
    a, b = report["variants"]["a"], report["variants"]["b"]
    assert a["verdict"] == "worse" and a["reasons"][0]["code"] == "blocked_rejects"
    assert b["verdict"] in ("inconclusive", "equivalent")
    assert report["blocked_analysis"]["family_df"] > len(seeds) - 1  # more df than one paired t-test's
    report.update(comparisons=2, level=0.05)
    assert report["analysis"] == "blocked" and report["blocked_analysis"]["seeds"] == [1, 2, 3, 4, 5]
    assert a["reasons"][0]["p_adjusted"] < a["reasons"][0]["alpha"] == 0.05  # the simultaneous p decides
    # a's |t| lies beyond every draw of the largest |t|: its p is bounded by the draws, never worded as 0
    assert a["reasons"][0]["p_adjusted"] == 0
    assert render.REASONS["blocked_rejects"](a["reasons"][0]).startswith("simultaneous p < 5e-05 < 0.05; ")
    assert render.p_cell(a["p_holm"]) == "< 5e-05" and render.p_cell(0.0123) == "0.0123"
    # the column that decides is named for the p it holds (Holm's only in the paired analysis)
    assert "The p (simultaneous) column holds the single-step simultaneous p" in render.analysis_text(report)
    assert render.adjusted_p_column(report) == "p (simultaneous)"
    assert render.adjusted_p_column(dict(report, analysis="paired")) == "p (Holm)"


def test_suite_json_names_config_files_relative_to_the_repository(tmp_path):
    from ablation import suites
    suite = declared(tmp_path)
    suite["variants"]["a"]["config"] = [os.path.join(runtime.REPO_DIR, "config", "train_ra_late.py"), "/elsewhere/x.py"]
    suites.freeze_suite(suite, [("a-seed1", dict(variant="a", seed=1), [])], str(tmp_path / "out"))
    frozen = json.load(open(tmp_path / "out" / "suite.json"))
    assert frozen["variants"]["a"]["config"] == [os.path.join("config", "train_ra_late.py"), "/elsewhere/x.py"]
    assert suites.check_declaration(declared(tmp_path), str(tmp_path / "out")) is not None  # it resumes
