"""ablation/compare.py's own logic on synthetic run records (no training, no words): what it refuses
(undeclared differences, broken pairing, a metric measured unlike), the equal-FLOPs point, the
sequential spending of alpha over declared looks, and the codes and numbers it returns."""
import math

import numpy as np
import pytest

from ablation import compare, stats


def a_run(variant, seed, final_loss, tokens=1000, config=None, facts=None, events=None):
    """A finished run's record as rundir.read_run returns it: evaluations at 0 and `tokens`, an end."""
    events = events or [dict(event="eval", tokens=0, iter=0, val_loss=4.0),
                        dict(event="eval", tokens=tokens, iter=10, val_loss=final_loss),
                        dict(event="end", tokens=tokens, iter=10, train_time=1.0)]
    # a seed's own batches and initial weights (as a real run's fingerprints depend on its seed)
    info = dict(facts=dict(dict(data_order=f"order{seed}", init_weights={"wte": [[4, 2], f"x{seed}"]}), **(facts or {})),
                code_versions=["x"])
    return dict(out_dir=f"{variant}-seed{seed}", config=dict(dict(seed=seed, out_dir=f"{variant}-seed{seed}"),
                                                             **(config or {})), info=info, events=events)


def suite_of(runs, allowed=(), **more):
    variants = {}
    for variant, seed in runs:
        variants.setdefault(variant, []).append(seed)
    return dict(name="toy", metric="val_loss", baseline="base", allowed=list(allowed), variants=variants, **more)


def two_variants(effect=0.1, seeds=(1, 2, 3), other_config=None, other_facts=None):
    runs = {}
    for seed in seeds:
        base = 2.0 + 0.01 * seed
        runs[("base", seed)] = a_run("base", seed, base)
        runs[("other", seed)] = a_run("other", seed, base + effect + 0.001 * seed, config=other_config,
                                      facts=other_facts)
    return runs


def test_an_undeclared_config_difference_is_refused_and_a_declared_one_compared():
    runs = two_variants(other_config=dict(batch_size=8))
    for run in (r for (v, _), r in runs.items() if v == "base"):
        run["config"]["batch_size"] = 4
    refused = compare.compare(suite_of(runs), runs)["variants"]["other"]
    assert refused["verdict"] == "not comparable" and refused["p_holm"] is None
    assert refused["reasons"] == [dict(code="confounds", confounds={"batch_size": [8, 4]})]
    declared = compare.compare(suite_of(runs, allowed=["batch_size"]), runs)["variants"]["other"]
    assert declared["verdict"] == "worse" and declared["p_holm"] < 0.05 and declared["confounds"] == {}


def test_a_measured_fact_no_declared_key_explains_is_a_confound():
    runs = two_variants(other_facts=dict(dtype="bfloat16"))
    for run in (r for (v, _), r in runs.items() if v == "base"):
        run["info"]["facts"]["dtype"] = "float32"
    entry = compare.compare(suite_of(runs), runs)["variants"]["other"]
    assert entry["verdict"] == "not comparable" and entry["confounds"] == {"dtype": ["bfloat16", "float32"]}
    assert compare.compare(suite_of(runs, allowed=["dtype"]), runs)["variants"]["other"]["verdict"] == "worse"


def test_pairing_holds_only_for_the_same_data_order_and_initial_weights():
    base = a_run("base", 1, 2.0)
    same = a_run("other", 1, 2.1)
    assert compare.pairing(same, base, []) == []
    shuffled = a_run("other", 1, 2.1, facts=dict(data_order="other"))
    assert compare.pairing(shuffled, base, []) == [dict(code="data_order")]
    assert compare.pairing(shuffled, base, ["data_seed"]) == []  # a declared cause of another order
    restarted = a_run("other", 1, 2.1, facts=dict(init_weights={"wte": [[4, 2], "y"], "new": [[2], "z"]}))
    assert compare.pairing(restarted, base, []) == [dict(code="init_weights", differ=1, shared=1, example="wte")]
    assert compare.pairing(dict(same, info=None), base, []) == [dict(code="no_run_info")]
    checks = compare.compare(suite_of(two_variants()), two_variants())["variants"]["other"]["pairing"]
    assert checks == [dict(seed=s, paired=True, problems=[]) for s in (1, 2, 3)]


def test_a_metric_measured_unlike_blocks_every_verdict_and_names_both_runs():
    runs = two_variants()
    runs[("other", 2)]["config"]["eval_iters"] = 7
    report = compare.compare(suite_of(runs, allowed=["eval_iters"]), runs)
    assert report["measurement_problems"] == [dict(code="differs", key="eval_iters", run="other-seed2", value=7,
                                                   other="base-seed1", other_value=None)]
    assert report["variants"]["other"]["verdict"] == "not comparable"
    assert report["variants"]["other"]["reasons"] == [dict(code="measurement")]


def test_what_blocks_a_verdict_comes_in_order_confounds_then_unfinished_runs_then_no_seed():
    incomplete = [dict(code="no_paired_seed")]
    assert compare.blocked_verdict({"k": (1, 2)}, incomplete, 3)[0] == "not comparable"
    assert compare.blocked_verdict({}, incomplete, 3) == ("incomplete", incomplete)
    assert compare.blocked_verdict({}, [], 0) == ("incomplete", [dict(code="no_paired_seed")])
    assert compare.blocked_verdict({}, [], 3) is None


def test_an_unfinished_run_is_counted_not_dropped():
    runs = two_variants()
    runs[("other", 3)]["events"] = runs[("other", 3)]["events"][:2]  # no `end`: it died
    entry = compare.compare(suite_of(runs), runs)["variants"]["other"]
    assert entry["verdict"] == "incomplete" and entry["n"] == 2 and entry["paired_seeds"] == [1, 2]
    assert entry["reasons"] == [dict(code="unfinished", unfinished=[dict(variant=True, seed=3, status="failed")],
                                     non_finite=[], metric="val_loss")]


def test_a_deterministic_pair_is_no_test_and_says_so_with_its_offset():
    runs = two_variants(effect=0.0)
    for seed in (1, 2, 3):
        runs[("other", seed)] = a_run("other", seed, 2.0 + 0.01 * seed + 0.05)
    entry = compare.compare(suite_of(runs), runs)["variants"]["other"]
    assert entry["verdict"] == "deterministic" and entry["p_holm"] is None
    assert entry["reasons"][0]["code"] == "deterministic" and entry["reasons"][0]["offset"] == pytest.approx(0.05)


def test_the_design_is_a_code_with_the_fork_point_beside_it():
    runs = two_variants()
    assert compare.compare(suite_of(runs), runs)["design_code"] == "from_scratch"
    for run in runs.values():
        run["events"].insert(0, dict(event="fork", iter=4, tokens=400, train_time=0.5, trunk="trunk-seed1"))
    report = compare.compare(suite_of(runs), runs)
    assert report["design_code"] == "forked" and report["fork_at"] == 4
    assert compare.design({("base", 1): dict(events=[])}) == "not_logged"


def test_equal_flops_tokens_count_the_trunk_at_the_baselines_rate():
    # from scratch a variant at 1.25x FLOPs per token spends the baseline's 5000 tokens' FLOPs at 4000
    assert compare.equal_flops_tokens(5000, 0, 1000, 1250) == pytest.approx(4000)
    # forked at 2500, the trunk's tokens are the baseline's model: 2500 + 2500 / 1.25
    assert compare.equal_flops_tokens(5000, 2500, 1000, 1250) == pytest.approx(4500)
    assert compare.equal_flops_tokens(5000, 2500, 1000, 1000) == 5000  # the same model: the same point
    # only a finished run's final evaluation stands for the point: one that ends there, never one on the way
    ended = lambda ts: dict(events=[*(dict(event="eval", tokens=t, val_loss=3.0 - t / 1e4) for t in ts),
                                    dict(event="end", tokens=ts[-1])])
    assert compare.final_at_flops(ended((1000, 4000)), "val_loss", 1000 * 5000, 1000, 1250) == (4000, pytest.approx(2.6))
    assert compare.final_at_flops(ended((1000, 4000, 4100, 5000)), "val_loss", 1000 * 5000, 1000, 1250) == (5000, None)
    unfinished = dict(events=[dict(event="eval", tokens=4000, val_loss=2.6)])
    assert compare.final_at_flops(unfinished, "val_loss", 1000 * 5000, 1000, 1250) == (None, None)


def test_declared_looks_spend_alpha_monotonically_and_in_total_exactly_alpha():
    looks, alpha, record, spent = [3, 6, 10, 20], 0.05, [], []
    for n in looks:
        level, look = compare.sequential_alpha(dict(alpha=alpha, looks=looks, record=record), n)
        assert look["code"] == "planned_look" and look["number"] == len(spent) + 1 and look["spent"] == level
        spent.append(level)
        record.append(dict(event="look", seeds=n))
    assert all(s > 0 for s in spent) and sum(spent) == pytest.approx(alpha)
    cumulative = np.cumsum(spent)
    assert all(np.diff(cumulative) > 0) and spent[0] < alpha / len(looks)  # little early (O'Brien-Fleming)
    fractions = np.linspace(0.05, 1, 40)
    curve = [compare.obrien_fleming_spent(t, alpha) for t in fractions]
    assert all(np.diff(curve) > 0) and curve[-1] == pytest.approx(alpha)
    assert cumulative == pytest.approx([compare.obrien_fleming_spent(n / looks[-1], alpha) for n in looks])


def test_looks_off_the_plan_or_without_one_keep_the_nominal_alpha_and_say_so():
    record = [dict(event="look", seeds=3)]
    level, look = compare.sequential_alpha(dict(alpha=0.05, looks=[3, 6], record=record), 5)
    assert level == 0.05 and look["code"] == "off_plan" and look["looks"] == [3, 5] and look["planned"] == [3, 6]
    grown = record + [dict(event="added", runs=["b-seed4", "a-seed4"], looks_before=1)]
    level, look = compare.sequential_alpha(dict(alpha=0.05, record=grown), 4)
    assert level == 0.05 and look["code"] == "unplanned_looks"
    assert look["added"] == dict(runs=["a-seed4", "b-seed4"], looks_before=1)
    level, look = compare.sequential_alpha(dict(alpha=0.05, record=[dict(event="look", seeds=3)]), 3)
    assert level == 0.05 and look["code"] == "one_look" and look["added"] is None  # the same data: no new look


def test_holm_over_the_family_keeps_its_size_when_a_comparison_is_blocked():
    runs = two_variants()
    for seed in (1, 2, 3):
        runs[("third", seed)] = a_run("third", seed, 2.0 + 0.01 * seed + 0.1 + 0.001 * seed, config=dict(x=1))
    report = compare.compare(suite_of(runs), runs)
    assert report["comparisons"] == 2 and report["level"] == 0.025
    assert report["variants"]["third"]["verdict"] == "not comparable"
    other = report["variants"]["other"]
    raw = other["p_value"]
    assert other["p_holm"] == pytest.approx(min(1.0, 2 * raw))  # the blocked one counts as p = 1, k stays 2
    assert other["reasons"][0] == dict(code="holm_rejects", p_holm=other["p_holm"], alpha=0.05,
                                       step_level=0.025, interval=other["interval"], confidence=0.975)


def test_a_metric_that_is_not_finite_is_named_as_data():
    runs = two_variants()
    runs[("other", 2)]["events"][1]["val_loss"] = math.nan
    report = compare.compare(suite_of(runs), runs)
    assert report["non_finite"] == [dict(file="other-seed2/log.jsonl", metric="val_loss", value="nan", tokens=1000)]
    entry = report["variants"]["other"]
    assert entry["verdict"] == "incomplete" and entry["reasons"][0]["non_finite"] == [dict(variant=True, seed=2)]


def test_the_seed_plan_comes_from_each_variants_own_differences():
    report = compare.compare(suite_of(two_variants(), min_effect=0.01), two_variants())
    sds = compare.difference_sds(report)
    assert list(sds) == ["other"] and sds["other"][1] == 2
    assert sds["other"][0] == pytest.approx(np.std(report["variants"]["other"]["differences"], ddof=1))
    assert report["plan"]["per_variant"]["other"]["sd"] == sds["other"][0]
    assert report["plan"]["level"] == stats.family_level(0.05, 1)
