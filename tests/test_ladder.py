"""Ladder suites (sweep.py's expansion, ablation/ladder.py's across-size statement, ablation/render.py's
report): the trend of known synthetic effects, the fit's calibration by simulation (also with sizes
correlated within a seed), the trend withheld while the learning rate or the forked design fails, the
per-size rules in every run's config, and a tiny ladder run end to end."""
import json
import math
import os
import re

import numpy as np
import pytest

import configurator
import runtime
from ablation import compare, ladder, ladder_power, render, suites
from slurm import jobs as slurm_jobs
import sweep
from helpers import toy_args, wait_for, write_growing_suite

SHAPES = {"s": dict(n_layer=2, n_embd=32, n_head=2), "m": dict(n_layer=2, n_embd=64, n_head=2),
          "l": dict(n_layer=2, n_embd=128, n_head=2)}
LADDER = suites.check_ladder(dict(sizes=SHAPES, reference="m", tokens=("params", 1.0),
                                  learning_rate=("params", -1 / 3), alpha=0.05,
                                  extrapolate_to=("big", dict(n_layer=12, n_embd=768))), {})


def synthetic_size_report(effects, seeds=(1, 2, 3), noise=0.004, rng_seed=0):
    """ablation.compare over synthetic finished runs of one size: the baseline's final val loss per
    seed, and each variant's = baseline + its effect + noise (the same facts in every run, so
    pairing holds and nothing is confounded). effects: {variant: mean paired difference}."""
    rng = np.random.default_rng(rng_seed)
    runs, variants = {}, {"base": list(seeds)}
    for seed in seeds:
        base_loss = 2.0 + 0.05 * rng.standard_normal()
        runs[("base", seed)] = finished_run("base", seed, base_loss)
        for variant, effect in effects.items():
            variants[variant] = list(seeds)
            runs[(variant, seed)] = finished_run(variant, seed, base_loss + effect + noise * rng.standard_normal())
    suite = dict(name="toy", metric="val_loss", baseline="base", allowed=[], variants=variants, alpha=0.05,
                 min_effect=None)
    return compare.compare(suite, runs)


def finished_run(variant, seed, final_loss):
    events = [dict(event="eval", tokens=0, iter=0, val_loss=4.0), dict(event="eval", tokens=1000, iter=10,
                                                                       val_loss=final_loss),
              dict(event="end", tokens=1000, iter=10, train_time=1.0)]
    info = dict(facts=dict(data_order="same", init_weights={}), code_versions=["x"])
    return dict(out_dir=f"{variant}-seed{seed}", config=dict(seed=seed, out_dir=f"{variant}-seed{seed}"),
                info=info, events=events)


def across(per_size, lr_checked=None):
    """ladder.across_sizes over {size: {variant: effect}}."""
    return ladder.across_sizes(LADDER, size_reports(per_size), "lower", lr_checked)["variants"]


def size_reports(per_size, seeds=None):
    """{size: synthetic_size_report}; seeds: {size: the seeds run there} (1, 2, 3 by default)."""
    return {size: synthetic_size_report(effects, rng_seed=i, **({"seeds": seeds[size]} if seeds and size in seeds else {}))
            for i, (size, effects) in enumerate(per_size.items())}


def test_a_growing_effect_grows_a_flat_one_shows_no_trend_and_a_sign_change_flips():
    # Effects linear in ln N: N grows 4x per size, so +0.02 per size is +0.0144 per e-fold.
    result = across({"s": dict(grows=0.01, flat=0.02, flips=-0.03, shrinks=0.05),
                     "m": dict(grows=0.03, flat=0.02, flips=0.0, shrinks=0.03),
                     "l": dict(grows=0.05, flat=0.02, flips=0.03, shrinks=0.01)})
    assert {v: r["trend"] for v, r in result.items()} == dict(grows="grows", flat="no trend detectable",
                                                              flips="flips", shrinks="shrinks")
    grows = result["grows"]["fit"]
    assert grows["slope_interval"][0] < 0.02 / math.log(4) < grows["slope_interval"][1]
    assert grows["confidence"] == pytest.approx(1 - 0.05 / 4)  # Bonferroni over the 4 variants
    # The extrapolation is the fitted line at N of the named size; 2.3 ladder widths past the largest
    # size it is an unsupported line, without an interval (ablation/ladder_power.py).
    target = 12 * 12 * 768 ** 2
    assert grows["extrapolated"]["params"] == target
    assert grows["extrapolated"]["effect"] == pytest.approx(grows["intercept"] + grows["slope"] * math.log(target))
    assert grows["extrapolated"]["supported"] is False and grows["extrapolated"]["interval"] is None
    assert result["grows"]["detectable"]["slope"] > 0  # every trend statement carries what the ladder could see
    assert result["grows"]["detectable"]["df"] == 3 * (3 - 1)  # its sd pooled over the sizes, not one size's 2 df
    assert grows["seeds"] == ["1", "2", "3"] and grows["df"] == 2 and grows["left_out"] == {}
    assert [e["size"] for e in result["grows"]["effects"]] == ["s", "m", "l"]
    assert [e["params"] for e in result["grows"]["effects"]] == [12 * 2 * 32 ** 2, 12 * 2 * 64 ** 2, 12 * 2 * 128 ** 2]


def test_a_ladder_missing_a_size_in_one_variant_is_incomplete_not_a_trend():
    result = across({"s": dict(a=0.01, b=0.01), "m": dict(a=0.03, b=0.03), "l": dict(a=0.05)})
    assert result["a"]["trend"] == "grows"
    assert result["b"]["trend"] == "incomplete" and result["b"]["fit"] is None
    assert result["b"]["reasons"] == [dict(code="size_unusable", sizes={"l": dict(
        verdict="incomplete", reasons=[dict(code="no_run_at_size")])})]


def test_a_seed_missing_a_size_is_named_and_left_out_of_the_fit():
    reports = size_reports({"s": dict(a=0.01), "m": dict(a=0.03), "l": dict(a=0.05)}, seeds={"l": (1, 2)})
    fit = ladder.across_sizes(LADDER, reports, "lower")["variants"]["a"]["fit"]
    assert fit["seeds"] == ["1", "2"] and fit["left_out"] == {"3": ["l"]} and fit["df"] == 1
    assert "left out, missing a size: seed 3 (l)" in render.left_out_text(fit)
    reports = size_reports({"s": dict(a=0.01), "m": dict(a=0.03), "l": dict(a=0.05)}, seeds={"m": (1, 2), "l": (2, 3)})
    entry = ladder.across_sizes(LADDER, reports, "lower")["variants"]["a"]
    assert entry["trend"] == "incomplete" and entry["fit"] is None
    assert entry["reasons"] == [dict(code="too_few_complete_seeds", seeds=1, left_out={"1": ["l"], "3": ["m"]})]


def per_seed_effects(params, diffs):
    """ladder.fit_trend's input from an array of paired differences (sizes, seeds)."""
    return [dict(params=n, size=f"s{i}", differences={str(s + 1): float(d) for s, d in enumerate(row)})
            for i, (n, row) in enumerate(zip(params, diffs))]


def test_the_trend_fit_keeps_its_level_under_the_null_and_finds_a_real_slope():
    """3 sizes x 3 seeds with unequal noise, through the report's own fit: with no slope, the interval
    at 95% excludes 0 in at most 5% of ladders (within Monte Carlo error); a slope of 0.03 per e-fold
    is found in at least 80%."""
    rng = np.random.default_rng(0)
    params, sds = [2e5, 8e5, 3.2e6], np.array([0.01, 0.02, 0.015])

    def rejects(slope):
        diffs = slope * np.log(np.array(params) / params[0])[:, None] + sds[:, None] * rng.standard_normal((3, 3))
        lo, hi = ladder.fit_trend(per_seed_effects(params, diffs), 0.05)["slope_interval"]
        return not lo <= 0 <= hi

    draws = 1000
    assert np.mean([rejects(0.0) for _ in range(draws)]) <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / draws)
    assert np.mean([rejects(0.03) for _ in range(300)]) >= 0.8


def independent_weighted_fit_rejects(x, diffs, level):
    """The fit this ladder used before (for comparison only): weighted least squares of the per-size
    mean differences on ln N, weights 1/se^2 from each size's own seeds, the sizes taken as
    independent, the slope's se widened by max(1, chi^2/df) (Knapp-Hartung), Student t with seeds - 1
    df. diffs: (draws, sizes, seeds). Returns whether each ladder rejects a flat truth."""
    from scipy import stats
    n = diffs.shape[2]
    means, w = diffs.mean(axis=2), n / diffs.var(axis=2, ddof=1)
    xbar = (w * x).sum(axis=1) / w.sum(axis=1)
    ybar = (w * means).sum(axis=1) / w.sum(axis=1)
    sxx = (w * (x - xbar[:, None]) ** 2).sum(axis=1)
    slope = (w * (x - xbar[:, None]) * (means - ybar[:, None])).sum(axis=1) / sxx
    chi2 = (w * (means - ybar[:, None] - slope[:, None] * (x - xbar[:, None])) ** 2).sum(axis=1)
    se = np.sqrt(np.maximum(1.0, chi2 / (len(x) - 2)) / sxx)
    return 2 * stats.t.sf(np.abs(slope) / se, n - 1) < level


def test_the_per_seed_fit_keeps_its_level_when_sizes_are_correlated_within_a_seed():
    """Every size shares each seed's data order, so a seed's differences at the sizes are correlated.
    No true slope, the shipped ladder's four sizes, 4000 simulated ladders per case, level 5%:
    - a seed effect shared by all sizes (correlation 0.8 between every two sizes, the sizes' sds as
      unequal as the shipped report's): it cancels from every seed's slope, and the per-seed t keeps
      its level;
    - a seed whose difference drifts with N (a slope of its own per seed, sd 0.004 per e-fold, around
      the true 0, on a shared seed effect of sd 0.002): the per-seed t keeps its level, at 3 and at 5
      seeds, while the weighted fit that took sizes as independent rejects the flat truth too often
      (its per-size ses do not carry the drift that all sizes of a seed share), which is why the
      ladder fits per seed. (Under the shared effect alone that old fit was conservative.)"""
    x = np.log([27648, 76800, 196608, 442368])
    level, draws = 0.05, 4000
    allowed = level + 3 * math.sqrt(level * (1 - level) / draws)  # the level within Monte Carlo error
    rng = np.random.default_rng(7)
    shared = 0.8 + 0.2 * np.eye(4)  # correlation 0.8 between every two sizes
    sds = np.array([0.006, 0.003, 0.004, 0.001])
    diffs = sds[None, :, None] * np.einsum("ij,djs->dis", np.linalg.cholesky(shared), rng.standard_normal((draws, 4, 3)))
    assert ladder_power.slope_rejects(x, diffs, level)[1].mean() <= allowed
    for seeds in (3, 5):
        drift = 0.004 * rng.standard_normal((draws, 1, seeds)) * (x - x.mean())[None, :, None]
        diffs = drift + 0.002 * rng.standard_normal((draws, 1, seeds)) + 0.0005 * rng.standard_normal((draws, 4, seeds))
        assert ladder_power.slope_rejects(x, diffs, level)[1].mean() <= allowed
        assert independent_weighted_fit_rejects(x, diffs, level).mean() > allowed


def test_the_trend_is_withheld_while_the_learning_rate_check_or_a_forked_verdict_fails():
    """A clear growth (the one above) is stated only when the learning-rate check supports the rule's
    rate at both checked ends (s and l) and every size's forked verdicts stand."""
    per_size = {"s": dict(grows=0.01), "m": dict(grows=0.03), "l": dict(grows=0.05)}
    three = {"0.5": 2.1, "1": 2.0, "2": 2.05}
    row = lambda holds, values=three, **more: dict(holds=holds, values=values, **more)
    holds = lambda s, l: dict(factors=[1.0, 0.5, 2.0], sizes={"s": s, "l": l})
    assert across(per_size, holds(row("yes"), row("yes")))["grows"]["trend"] == "grows"
    beaten = row("beaten", best="2x", by=0.036)
    unfinished = row("incomplete", {"0.5": 2.1, "2": 2.05}, missing=["1"])
    for checked, failing in ((holds(row("yes"), beaten), dict(code="rule_fails", size="l", **beaten)),
                             (holds(row("yes"), unfinished), dict(code="rule_fails", size="l", **unfinished)),
                             (holds(row("yes"), row("yes", {"1": 2.0})),  # a lone 1x is best by default
                              dict(code="too_few_factors", size="l", finished=1, factors=3)),
                             (dict(factors=[1.0, 0.5, 2.0], sizes={"s": row("yes")}), dict(code="not_run", size="l"))):
        entry = across(per_size, checked)["grows"]
        assert entry["trend"] == "withheld" and entry["fit"] is not None  # the numbers kept, the statement not made
        assert entry["reasons"] == [dict(code="lr_check_fails", sizes=[failing])]
    reports = size_reports(per_size)
    jump = dict(code="fork_jump", mean=0.066, margin=0.01)
    reports["m"]["does_not_stand"] = {"grows": [jump]}
    entry = ladder.across_sizes(LADDER, reports, "lower", holds(row("yes"), beaten))["variants"]["grows"]
    assert entry["trend"] == "withheld" and entry["reasons"] == [
        dict(code="lr_check_fails", sizes=[dict(code="rule_fails", size="l", **beaten)]),
        dict(code="forked_does_not_stand", sizes={"m": [jump]})]
    across_ = ladder.across_sizes(LADDER, reports, "lower", holds(row("yes"), row("yes")))
    assert across_["variants"]["grows"]["reasons"] == [dict(code="forked_does_not_stand", sizes={"m": [jump]})]
    text = render.ladder_markdown(dict(suite="toy", metric="val_loss", goal="lower", baseline="base", allowed=[],
                                       per_size={}, across_sizes=across_), None)
    assert "| grows | **withheld** | - | - | - | - | - | - |" in text  # no slope to read a trend into
    assert "- **grows**: withheld: the forked verdicts at m (" in text and "Extrapolated" not in text


def ladder_suite(tmp_path, data_dir, variants, seeds=(1, 2), rules="tokens=('params', 1.0), "
                 "learning_rate=('params', -1 / 3)"):
    recipe = tmp_path / "recipe_m.py"  # the reference size's shape: the rules scale from it
    recipe.write_text("n_layer = 2\nn_embd = 64\nn_head = 2\n")
    path = tmp_path / "suite_ladder.py"
    path.write_text(f"variants = {variants!r}\nbaseline = 'base'\nseeds = {list(seeds)!r}\nmetric = 'val_loss'\n"
                    f"allowed = ['ra_pattern']\nbase = ['recipe_m.py']\nsuite_dir = {str(tmp_path / 'out-ladder')!r}\n"
                    f"ladder = dict(sizes={SHAPES!r}, reference='m', {rules})\n")
    shape = tuple(f"--{k}=" for k in ladder.SHAPE_KEYS)  # the ladder sets them
    return [str(path), *(a for a in toy_args(data_dir) if not a.startswith(shape)), "--learning_rate=0.01",
            "--batch_size=4", "--model_type=ra",
            "--max_iters=8", "--lr_decay_iters=8",
            "--warmup_iters=2"]


def test_the_rules_set_budget_and_learning_rate_in_every_runs_config(data_dir, tmp_path):
    argv = ladder_suite(tmp_path, data_dir, {"base": {}, "ra": {"ra_pattern": "all"}})
    runs = sweep.main([*argv, "--dry_run=True"])
    assert len(runs) == 3 * 2 * 2  # sizes x variants x seeds
    assert [name for name, _, _ in runs][:4] == ["s/base-seed1", "s/base-seed2", "s/ra-seed1", "s/ra-seed2"]
    for name, point, run_argv in runs:
        cfg = configurator.apply_config(runtime.DEFAULTS, run_argv)
        ratio = ladder.non_embedding_params(SHAPES[point["size"]]) / ladder.non_embedding_params(SHAPES["m"])
        assert {k: cfg[k] for k in SHAPES["s"]} == SHAPES[point["size"]]
        assert cfg["max_iters"] == round(8 * ratio) and cfg["lr_decay_iters"] == round(8 * ratio)
        assert cfg["warmup_iters"] == round(2 * ratio)
        assert cfg["learning_rate"] == pytest.approx(0.01 * ratio ** (-1 / 3), rel=1e-3)
        assert cfg["min_lr"] == pytest.approx(1e-3 * ratio ** (-1 / 3), rel=1e-3)
        assert cfg["out_dir"] == os.path.join(str(tmp_path / "out-ladder"), point["size"], name.split("/")[1])
    # A width rule: the learning rate as 1 / n_embd, tokens the same at every size.
    runs = sweep.main([*ladder_suite(tmp_path, data_dir, {"base": {}, "ra": {"ra_pattern": "all"}},
                                     rules="tokens=('params', 0.0), learning_rate=('width', -1.0)"), "--dry_run=True"])
    cfgs = {p["size"]: configurator.apply_config(runtime.DEFAULTS, a) for _, p, a in runs}
    assert {s: (c["learning_rate"], c["max_iters"]) for s, c in cfgs.items()} == {
        "s": (0.02, 8), "m": (0.01, 8), "l": (0.005, 8)}


def test_a_ladder_refuses_what_would_confound_it(data_dir, tmp_path):
    with pytest.raises(configurator.ConfigError, match=r"variants \{'ra': \['n_embd'\]\} set keys the ladder sets"):
        sweep.main([*ladder_suite(tmp_path, data_dir, {"base": {}, "ra": {"n_embd": 48}}), "--dry_run=True"])
    with pytest.raises(configurator.ConfigError, match="ra at size s: dropout = 0.1 vs baseline 0.0"):
        sweep.main([*ladder_suite(tmp_path, data_dir, {"base": {}, "ra": {"dropout": 0.1}}), "--dry_run=True"])
    with pytest.raises(ValueError, match="a size overlays only model-shape keys"):
        suites.check_ladder(dict(sizes=dict(SHAPES, s=dict(n_layer=2, n_embd=32, dropout=0.1)), reference="m"), {})
    with pytest.raises(configurator.ConfigError, match=r"variant 'base': the recipe is not of the reference size 'm': "
                                                       r"n_embd=32 \(the size has 64\): name the size"):
        sweep.main([*ladder_suite(tmp_path, data_dir, {"base": {}}), "--n_embd=32", "--dry_run=True"])
    with pytest.raises(configurator.ConfigError, match="the recipe sets max_time: a ladder's token rule scales max_iters"):
        sweep.main([*ladder_suite(tmp_path, data_dir, {"base": {}}), "--max_time=60", "--dry_run=True"])
    problems = ladder.across_size_problems({"s": dict(n_embd=32, dropout=0.1), "m": dict(n_embd=64, dropout=0.0)},
                                           dict(reference="m"))
    assert problems == [("s", "dropout", 0.1, 0.0)]


def test_a_ladder_forks_each_size_at_the_same_share_of_its_budget_and_names_a_bad_size(data_dir, tmp_path):
    """Issue 41: fork_at=10 forked every size at the same step (67% of the smallest budget, 17% of the
    largest). fork_at counts the reference size's iterations; each size forks at that share of its own."""
    argv = ladder_suite(tmp_path, data_dir, {"base": {}, "ra": {"ra_pattern": "all"}}, seeds=(1,))
    with open(argv[0], "a") as f:
        f.write("fork_at = 4\nfork_cold_starts = ['ra']\n")
    runs = sweep.main([*argv, "--dry_run=True"])
    trunks = {p["size"]: configurator.apply_config(runtime.DEFAULTS, a)["max_iters"] for n, p, a in runs if p.get("trunk")}
    branches = {p["size"]: configurator.apply_config(runtime.DEFAULTS, a)["max_iters"] for n, p, a in runs
                if p.get("after") and p["variant"] == "ra"}
    assert trunks == {"s": 1, "m": 4, "l": 16} and branches == {"s": 2, "m": 8, "l": 32}  # half of every budget
    text = open(argv[0]).read().replace("'n_embd': 32, 'n_head': 2", "'n_embd': 32, 'n_head': 3")
    open(argv[0], "w").write(text)
    with pytest.raises(configurator.ConfigError, match="run s/base-seed1: .*n_head"):
        sweep.main([*argv, "--dry_run=True"])


class Finished:
    returncode = 0

    def poll(self):
        return 0


def synthetic_launcher(calls, effect):
    """Instead of train.py: a finished run directory whose config is the one the sweep resolved for
    it and whose final val loss is 2 + effect(config) + seed noise (no training: seconds, not minutes)."""
    def launch(argv, slot, log_path):
        cfg = runtime.resolve(configurator.apply_config(runtime.DEFAULTS, argv), 1)
        out = cfg["out_dir"]
        calls.append(os.path.relpath(out, os.path.dirname(os.path.dirname(out))))
        json.dump(cfg, open(os.path.join(out, "config.json"), "w"))
        json.dump(dict(facts=dict(data_order=cfg["seed"], init_weights={}), code_versions=["x"]),
                  open(os.path.join(out, "run_info.json"), "w"))
        tokens = cfg["max_iters"] * cfg["tokens_per_iter"]
        loss = 2.0 + effect(cfg) + 0.002 * np.sin(7 * cfg["seed"] + cfg["n_embd"] + len(cfg["ra_pattern"]))
        with open(os.path.join(out, "log.jsonl"), "w") as f:
            n = ladder.non_embedding_params(cfg)
            for event in (dict(event="checklist", time=0.0, parameters=n, tokens_per_iter=128, flops_per_token=6 * n),
                          dict(event="eval", iter=0, tokens=0, val_loss=4.0),
                          dict(event="eval", iter=cfg["max_iters"], tokens=tokens, val_loss=loss),
                          dict(event="end", time=1.0, iter=cfg["max_iters"], tokens=tokens, train_time=1.0,
                               stop_reason="max_iters")):
                f.write(json.dumps(event) + "\n")
        return Finished()
    return launch


def test_a_ladder_suite_runs_resumes_and_reports_across_sizes(data_dir, tmp_path, capsys):
    """Through sweep.main: every variant x seed at every size, each size an ordinary suite with its
    own report, the across-size report with its table, plot and fit; an effect that grows by 0.02 per
    e-fold of N is called "grows"; a second run launches nothing."""
    argv = ladder_suite(tmp_path, data_dir, {"base": {}, "ra": {"ra_pattern": "all"}}, seeds=(1, 2, 3))
    grows = lambda cfg: 0.02 * math.log(ladder.non_embedding_params(cfg)) if cfg["ra_pattern"] == "all" else 0.0
    calls = []
    sweep.main(argv, launch=synthetic_launcher(calls, grows))
    assert len(calls) == 3 * 2 * 3 and calls[0] == "s/base-seed1"
    suite_dir = tmp_path / "out-ladder"
    for size in SHAPES:  # every size is an ordinary suite directory, with its own report
        assert json.load(open(suite_dir / size / "suite.json"))["runs"]["ra-seed2"] == ["ra", 2]
        size_report = json.load(open(suite_dir / size / "report.json"))  # issue 40: each size's report has its design
        assert size_report["suite"] == f"suite_ladder/{size}" and size_report["design_code"] == "from_scratch"
        assert os.path.exists(suite_dir / size / "report.md")
    report = json.load(open(suite_dir / "report.json"))["across_sizes"]
    ra = report["variants"]["ra"]
    assert [e["size"] for e in ra["effects"]] == ["s", "m", "l"] and all(e["n"] == 3 for e in ra["effects"])
    assert [e["diff"] for e in ra["effects"]] == pytest.approx(
        [0.02 * math.log(ladder.non_embedding_params(s)) for s in SHAPES.values()], abs=0.005)
    assert [e["compute"] for e in ra["effects"]] == [6 * ladder.non_embedding_params(SHAPES[s]) * 128 * n
                                                     for s, n in (("s", 2), ("m", 8), ("l", 32))]
    assert ra["trend"] == "grows" and ra["fit"]["slope_interval"][0] < 0.02 < ra["fit"]["slope_interval"][1]
    text = open(suite_dir / "report.md").read()
    assert report["reference"] == "m" and json.load(open(suite_dir / "m" / "report.json"))["about"]["lr_tuning"] == ""
    per_size = json.load(open(suite_dir / "report.json"))["per_size"]
    n = {size: ladder.non_embedding_params(shape) for size, shape in SHAPES.items()}
    assert {size: p["learning_rate"] for size, p in per_size.items()} == pytest.approx(
        {size: 0.01 * (n[size] / n["m"]) ** (-1 / 3) for size in SHAPES}, rel=1e-3)  # the rule's rates, 4 digits
    assert "![effect against size and compute](effect_vs_size.png)" in text
    assert os.path.getsize(suite_dir / "effect_vs_size.png") > 1000
    calls.clear()
    sweep.main(argv, launch=synthetic_launcher(calls, grows))  # finished runs are skipped, as in any suite
    assert calls == []
    capsys.readouterr()
    sweep.main([*argv, "--plan=True", "--budget=1m"])  # each size its own family; a seed costs every size's runs
    plan = capsys.readouterr().out
    assert all(f"size {size}: paired-difference sd " in plan for size in SHAPES)
    costs = [float(x) for x in re.findall(r"size \w: paired-difference sd [\d.e+-]+, wall time per seed ([\d.]+) s", plan)]
    total = float(re.search(r"a seed at every size: ([\d.]+) s of wall time", plan).group(1))
    assert len(costs) == 3 and total == pytest.approx(sum(costs), abs=2)
    with pytest.raises(configurator.ConfigError, match="is a ladder of 3 sizes"):  # never pooled as one suite
        sweep.main([write_growing_suite(tmp_path, [1, 2])[0], *toy_args(data_dir), "--plan=True",
                    f"--pilot={suite_dir}"])


@pytest.mark.xdist_group("slurm")  # beside tests/test_slurm.py's jobs, never at the same time
def test_a_ladder_on_slurm_runs_every_size_in_one_array_and_reports_across_sizes(cluster, jobs, data_dir, tmp_path):
    """--launcher=slurm: the ladder's runs (in their size subdirectories) are one job array, and the
    dependent status job builds each size's report and the across-size report."""
    argv = ladder_suite(tmp_path, data_dir, {"base": {}, "ra": {"ra_pattern": "all"}})
    sweep.main([*argv, "--launcher=slurm"])
    suite_dir = tmp_path / "out-ladder"
    records = [slurm_jobs.read_record(str(suite_dir / size / f"{v}-seed{s}"))
               for size in SHAPES for v in ("base", "ra") for s in (1, 2)]
    jobs.extend({r["job"] for r in records} | {r["status_job"] for r in records})
    assert len({r["job"].split("_")[0] for r in records}) == 1 and len({r["job"] for r in records}) == 12
    wait_for(lambda: os.path.exists(suite_dir / "report.json"), "the status job's across-size report", timeout=600)
    effects = json.load(open(suite_dir / "report.json"))["across_sizes"]["variants"]["ra"]["effects"]
    assert [(e["size"], e["n"]) for e in effects] == [("s", 2), ("m", 2), ("l", 2)]
    assert json.load(open(suite_dir / "l" / "ra-seed2" / "config.json"))["max_iters"] == 32


def write_lr_check_run(suite_dir, size, factor, outcome):
    """<size>/lrcheck-x<factor>-seed1 as a run left it: 'finished' at a val loss, 'diverged', or 'killed'
    (its start only: kill -9, the OOM killer)."""
    out = os.path.join(suite_dir, size, f"lrcheck-x{factor:g}-seed1")
    os.makedirs(out)
    events = [dict(event="checklist", time=0.0)]
    if outcome == "diverged":
        events.append(dict(event="diverged", time=1.0, iter=3))
    elif outcome != "killed":
        events += [dict(event="eval", iter=8, tokens=1024, val_loss=outcome),
                   dict(event="end", time=1.0, iter=8, tokens=1024, stop_reason="max_iters")]
    with open(os.path.join(out, "log.jsonl"), "w") as f:
        f.writelines(json.dumps(e) + "\n" for e in events)


def test_the_lr_check_needs_every_factor_and_names_a_diverged_run(tmp_path):
    """Issue 50: with the 2x run killed (or never run) the check said "rule holds: yes" from the 1x run
    alone; a diverged run was shown as "-" as if it had never run."""
    declared = dict(metric="val_loss", min_effect=0.01, ladder=dict(sizes=SHAPES, lr_check=[0.5, 2.0]))
    write_lr_check_run(tmp_path, "s", 1.0, 2.0)
    write_lr_check_run(tmp_path, "s", 0.5, 2.1)
    write_lr_check_run(tmp_path, "s", 2.0, "killed")
    write_lr_check_run(tmp_path, "l", 1.0, 2.0)
    write_lr_check_run(tmp_path, "l", 0.5, 2.05)
    write_lr_check_run(tmp_path, "l", 2.0, "diverged")
    checked = ladder.lr_check(str(tmp_path), declared)
    assert checked["sizes"]["s"]["holds"] == "incomplete" and checked["sizes"]["s"]["missing"] == ["2"]
    assert checked["sizes"]["l"] == dict(values={"0.5": 2.05, "1": 2.0, "2": "diverged"}, best="1x", holds="yes")
    rows = render.lr_check_lines(dict(lr_check=checked))
    assert "| s | 2 | 2.1 | - | 1x | incomplete: 2x not finished |" in rows
    assert "| l | 2 | 2.05 | diverged | 1x | yes |" in rows


class Diverged:
    returncode = 1

    def poll(self):
        return 1


def test_a_ladder_names_the_branches_of_a_diverged_trunk(data_dir, tmp_path):
    """Issue 50: the branches a diverged trunk never started were shown as "not run", as if nobody had
    tried them."""
    argv = ladder_suite(tmp_path, data_dir, {"base": {}, "gated": {"attn_gate": True}})
    text = open(argv[0]).read().replace("allowed = ['ra_pattern']", "allowed = ['attn_gate']")
    open(argv[0], "w").write(text + "fork_at = 4\n")
    argv.append("--fork_start=preserve")  # the gate's preserving start: the branch starts as its trunk computes
    finished = synthetic_launcher([], lambda cfg: 0.0)

    def launch(run_argv, slot, log_path):
        cfg = configurator.apply_config(runtime.DEFAULTS, run_argv)
        if not cfg["out_dir"].endswith(os.path.join("s", "trunk-seed1")):
            return finished(run_argv, slot, log_path)
        with open(os.path.join(cfg["out_dir"], "log.jsonl"), "w") as f:
            f.writelines(json.dumps(e) + "\n" for e in (dict(event="checklist", time=0.0),
                                                         dict(event="diverged", time=1.0, iter=1)))
        return Diverged()
    with pytest.raises(RuntimeError, match="3 runs failed: s/trunk-seed1, s/base-seed1, s/gated-seed1"):
        sweep.main(argv, launch=launch)
    report = json.load(open(tmp_path / "out-ladder" / "s" / "report.json"))
    assert report["variants"]["gated"]["runs"]["seed1"]["status"] == "not run (its trunk trunk-seed1 diverged)"
    assert report["variants"]["gated"]["verdict"] == "incomplete"
    assert dict(variant=True, seed=1, status="not run (its trunk trunk-seed1 diverged)") in \
        report["variants"]["gated"]["reasons"][0]["unfinished"]
    assert report["variants"]["gated"]["runs"]["seed2"]["status"] == "finished"
