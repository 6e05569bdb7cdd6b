"""tools/tune_lr.py on a loss surface whose best rate is known: the grid grows until it brackets the best
and is refined around it, a variant whose best rate is elsewhere is named, the recipe is rewritten, and seeds a comparison uses are
refused. Training is replaced by run directories written from the surface (the tool reads them as it reads
real runs); a real training run is not what these properties depend on."""
import json
import math
import os
import sys

import pytest

import configurator
import runtime
from tools import tune_lr

BEST = {"base": 1e-2, "other": 2.4e-2}  # each variant's best rate on the surface


def surface(variant, lr, seed):
    """A bowl in log(rate) around the variant's best, plus a seed offset shared by every rate."""
    return 2.0 + 0.05 * math.log(lr / BEST[variant]) ** 2 + 0.01 * (seed % 3)


@pytest.fixture
def written_runs(monkeypatch):
    """Replace training by a finished run whose last evaluation is the surface's value; record each run."""
    started = []

    def run_missing(jobs, metric, slots):
        for argv, out, _ in jobs:
            if tune_lr.final_value(out, metric) is not None:
                continue
            cfg = configurator.apply_config(runtime.DEFAULTS, argv)
            variant = os.path.basename(out).split("-lr")[0]
            started.append((variant, cfg["learning_rate"], cfg["min_lr"], cfg["seed"]))
            os.makedirs(out, exist_ok=True)
            with open(os.path.join(out, "config.json"), "w") as f:
                json.dump(cfg, f)  # what train.py records: the config the run trained with
            with open(os.path.join(out, "log.jsonl"), "w") as f:
                for i, v in enumerate([4.0, surface(variant, cfg["learning_rate"], cfg["seed"])]):
                    f.write(json.dumps(dict(event="eval", iter=i, tokens=1000 * i, val_loss=v)) + "\n")
                f.write(json.dumps(dict(event="end", iter=1, tokens=1000, stop_reason="max_iters")) + "\n")

    monkeypatch.setattr(tune_lr, "run_missing", run_missing)
    return started


def write_suite(tmp_path, lr=1e-3):
    recipe = tmp_path / "recipe.py"
    recipe.write_text(f"# the recipe\nlearning_rate = {lr!r}\nmin_lr = {lr / 10!r}\nmax_iters = 4\nwarmup_iters = 1\n")
    suite = tmp_path / "suite_tune.py"
    suite.write_text("variants = {'base': {'config': 'recipe.py', 'model_type': 'ra'},\n"
                     "            'other': {'config': 'recipe.py', 'model_type': 'ra', 'ra_pattern': 'all'}}\n"
                     "baseline = 'base'\nseeds = [1, 2, 3]\nmetric = 'val_loss'\nmin_effect = 0.01\n"
                     "allowed = ['ra_pattern']\n")
    return str(suite), str(recipe)


def tune(tmp_path, *extra):
    suite, recipe = write_suite(tmp_path)
    code = tune_lr.main([suite, f"--sweep_dir={tmp_path / 'runs'}", f"--out={tmp_path / 'out'}", *extra])
    return code, json.load(open(tmp_path / "out" / "tuning.json")), recipe


def test_the_grid_grows_past_an_edge_brackets_the_best_rate_and_refines_around_it(tmp_path, written_runs):
    code, result, recipe = tune(tmp_path, f"--write={tmp_path / 'recipe.py'}")
    rates = [row["lr"] for row in result["grid"]]
    # 1e-3 x (1, 2, 4) puts the best at the top edge; the grid grows by x2 until 8e-3 has a tried neighbour
    # above, then the midpoints 8e-3 / sqrt(2) and 8e-3 * sqrt(2) find 1.13e-2, nearer the surface's 1e-2
    half = 2 ** 0.5
    assert rates == pytest.approx([1e-3, 2e-3, 4e-3, 8e-3 / half, 8e-3, 8e-3 * half, 1.6e-2])
    assert code == 0 and result["bracketed"] and result["best_lr"] == pytest.approx(8e-3 * half)
    assert result["grid"][5]["values"] == pytest.approx([surface("base", 8e-3 * half, s) for s in (901, 902)])
    # min_lr follows the rate in the recipe's proportion, on the tuning seeds only
    assert {(round(lr / mn, 6), seed) for v, lr, mn, seed in written_runs if v == "base"} == {(10.0, 901), (10.0, 902)}
    text = open(recipe).read()
    assert "learning_rate = 0.01131\n" in text and "min_lr = 0.001131\n" in text and "max_iters = 4\n" in text
    assert f"lr_tuning = {result['summary']!r}" in text
    assert "7 rates 0.001..0.016 (x2, refined to x1.41 around the best)" in result["summary"]
    assert "best 0.0113 (bracketed)" in result["summary"]


def test_a_variant_whose_best_rate_differs_is_named_and_finished_runs_are_reused(tmp_path, written_runs):
    _, result, _ = tune(tmp_path)
    assert set(result["variants"]) == {"other"}
    check = result["variants"]["other"]
    assert [p["factor"] for p in check["points"]] == [0.5, 1.0, 2.0] and check["best_factor"] == 2.0
    assert "variants whose best rate differs (0.5x/1x/2x on seeds 901, 902): other 2x" in result["summary"]
    count = len(written_runs)
    assert count == 7 * 2 + 3 * 2  # 7 baseline rates and 3 variant rates, 2 seeds each
    tune(tmp_path)  # a second call (a stopped tuning resumed) trains nothing again
    assert len(written_runs) == count


def test_the_variants_check_can_run_on_some_of_the_tuning_seeds(tmp_path, written_runs):
    _, result, _ = tune(tmp_path, "--seeds=901,902,903", "--check_seeds=901,903")
    assert {seed for v, _, _, seed in written_runs if v == "other"} == {901, 903}
    assert result["check_seeds"] == [901, 903] and result["variants"]["other"]["best_factor"] == 2.0
    with pytest.raises(configurator.ConfigError, match="at least 2 distinct tuning seeds"):
        tune(tmp_path, "--seeds=901,902,903", "--check_seeds=901,904")


def test_a_grid_that_cannot_bracket_says_so_and_exits_nonzero(tmp_path, written_runs):
    code, result, _ = tune(tmp_path, "--max_points=4", "--variants=False")
    assert code == 1 and not result["bracketed"] and len(result["grid"]) == 4
    assert "NOT bracketed" in result["summary"]


@pytest.mark.parametrize("seeds, message", [("901", "at least 2 distinct"), ("2,901", "seeds the suite compares on"),
                                            ("901,901", "at least 2 distinct")])
def test_tuning_seeds_must_be_two_or_more_that_no_comparison_uses(tmp_path, written_runs, seeds, message):
    suite, _ = write_suite(tmp_path)
    with pytest.raises(configurator.ConfigError, match=message):
        tune_lr.main([suite, f"--seeds={seeds}", f"--sweep_dir={tmp_path / 'runs'}"])
    assert written_runs == []


def test_where_the_loss_is_flat_within_noise_the_lowest_tied_rate_is_chosen(tmp_path, written_runs, monkeypatch):
    """Breiman's one-standard-error rule: 4e-3's per-seed differences from the lowest mean (at 8e-3) have a
    mean within one standard error of 0, so 4e-3 is chosen; 'lowest_mean' keeps 8e-3."""
    noise = {901: 0.0, 902: 0.02, 903: -0.01}
    flat = {1e-3: 2.3, 2e-3: 2.1, 4e-3: 2.004, 8e-3: 2.0, 1.6e-2: 2.2}

    def bumpy(variant, lr, seed):
        level = next(v for r, v in flat.items() if math.isclose(r, lr, rel_tol=1e-6))
        return level + (noise[seed] if math.isclose(lr, 4e-3) else 0.0)

    monkeypatch.setattr(sys.modules[__name__], "surface", bumpy)
    seeds = "--seeds=901,902,903"
    _, one_se, _ = tune(tmp_path, seeds, "--refine=0", "--variants=False")
    assert one_se["best_lr"] == pytest.approx(4e-3) and one_se["lowest_mean_lr"] == pytest.approx(8e-3)
    assert ("best 0.004 (bracketed; the lowest rate within one standard error of the lowest mean, at 0.008)"
            in one_se["summary"])
    _, lowest, _ = tune(tmp_path, seeds, "--refine=0", "--variants=False", "--rule=lowest_mean")
    assert lowest["best_lr"] == pytest.approx(8e-3)


@pytest.mark.parametrize("ran, best, said", [
    (5e-3, 0.5, "; at 0.5x the baseline's rate, its own best on the tuning seeds: best against best"),
    (1e-2, 0.5, "; its own best rate on the tuning seeds is 0.5x the baseline's, so this same-rate answer may not be its best"),
    (2e-2, 1, "; at 2x the baseline's rate"),
    (1e-2, 1, ""),
    (1e-2, None, "")])
def test_a_headline_sentence_says_at_which_rate_the_variant_ran_and_whether_it_was_its_own_best(ran, best, said):
    from ablation import render
    report = dict(about=dict(learning_rate=1e-2), variants=dict(v=dict(learning_rate=ran)),
                  tuning=dict(best_factors={} if best is None else dict(v=best)))
    assert render.rate_clause(report, "v").startswith(said) and (said or render.rate_clause(report, "v") == "")
