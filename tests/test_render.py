"""ablation/render.py's own logic: every code the engine (stats, compare, bridge, ladder) can emit has its
words, each verdict gets a sentence, report.json gets the words beside the data without the data
changing. The words themselves are pinned once, by tests/test_report_golden.py."""
import ast
import copy
import json
import os

import numpy as np
import pytest

from ablation import bridge, compare, render, stats

ENGINE = [os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ablation", f"{name}.py")
          for name in ("stats", "compare", "bridge", "ladder")]


def constants(node):
    """The string constants a keyword's value can take (a constant, or either branch of a conditional)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.IfExp):
        return constants(node.body) | constants(node.orelse)
    return set()


def emitted(keyword):
    """Every string the engine's four modules pass as `keyword=` (e.g. code=..., verdict=..., holds=...) or
    assign to a variable of that name."""
    found = set()
    for path in ENGINE:
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.keyword) and node.arg == keyword:
                found |= constants(node.value)
            if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == [keyword]:
                found |= constants(node.value)
    return found


def assigned_verdicts():
    """The verdicts the engine sets as the first of a pair: `v["verdict"], v["reasons"] = "not comparable", ...` and
    compare.blocked_verdict's `return "incomplete", reasons`."""
    found = set()
    for path in ENGINE:
        for node in ast.walk(ast.parse(open(path).read())):
            pairs = []
            if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Tuple):
                first = node.targets[0].elts[0]
                if isinstance(first, ast.Subscript) and constants(first.slice) == {"verdict"}:
                    pairs.append(node.value)
            if isinstance(node, ast.FunctionDef) and node.name == "blocked_verdict":
                pairs += [n.value for n in ast.walk(node) if isinstance(n, ast.Return)]
            found |= set().union(*(constants(p.elts[0]) for p in pairs if isinstance(p, ast.Tuple)))
    return found


def test_every_code_the_engine_emits_has_words_and_no_words_wait_for_a_code_never_emitted():
    by_code = ("reasons", "lr_failing", "looks", "measurement", "pairing")
    assert emitted("code") == set().union(*(set(render.CODES[name]) for name in by_code))
    assert emitted("holds") == set(render.HOLDS)
    assert emitted("source") == set(render.ANSWER_SOURCES)  # which runs bridge.answers' answer comes from
    design = next(n for n in ast.walk(ast.parse(open(ENGINE[1]).read()))
                  if isinstance(n, ast.FunctionDef) and n.name == "design")
    returned = set().union(*(constants(n.value) for n in ast.walk(design) if isinstance(n, ast.Return)))
    assert returned == set(render.DESIGNS)


def judged(diffs, min_effect=0.05, others=(), plan=None, goal="lower"):
    return stats.judge([stats.paired_test(d) for d in (diffs, *others)], 0.05, goal, min_effect, plan)[0]


STATS_CASES = {  # the reasons stats.decide gives, each from a family that yields it
    "too_few_seeds": dict(diffs=[0.1, 0.3]),
    "deterministic": dict(diffs=[1e-6] * 3),
    "holm_rejects": dict(diffs=[0.3, 0.2, 0.25]),
    "beyond_margin": dict(diffs=[0.3, 0.2, 0.25]),
    "sign_flip_floor": dict(diffs=[0.3, 0.2, 0.25]),
    "negligible": dict(diffs=list(1e-4 + np.random.default_rng(3).normal(0, 2e-5, size=5)), min_effect=0.01),
    "not_beyond_margin": dict(diffs=[0.05, 0.06, 0.04, 0.055, 0.045, 0.05, 0.052, 0.048]),
    "equivalent": dict(diffs=[0.001, -0.002, 0.0005, 0.0015, -0.001]),
    "holm_holds_zero": dict(diffs=[-0.02, 0.05, 0.01]),
    "reaches_margin": dict(diffs=[-0.02, 0.05, 0.01]),
    "seed_plan": dict(diffs=[-0.02, 0.05, 0.01], plan=dict(seeds_needed=12)),
}


@pytest.mark.parametrize("code", sorted(STATS_CASES))
def test_each_reason_stats_gives_is_worded_from_its_own_numbers(code):
    decision = judged(**STATS_CASES[code])
    reasons = {r["code"]: r for r in decision["reasons"]}
    assert code in reasons, (code, list(reasons))
    words = render.REASONS[code](reasons[code])
    assert words and "None" not in words and "{" not in words
    for key in ("p_holm", "min_effect", "n", "seeds_needed"):
        if reasons[code].get(key) is not None and key != "n":
            assert format(reasons[code][key], ".3g" if key == "p_holm" else "g") in words, (key, words)
    sentence = render.why(decision)
    assert words in sentence and sentence.count(";") >= len(decision["reasons"]) - 1 - (code == "negligible")


def a_report(verdict, reasons, **more):
    variant = dict(verdict=verdict, reasons=reasons, n=3, diff_mean=0.01, interval=[0.005, 0.015],
                   interval_confidence=0.95, equivalence_interval=[0.004, 0.016], equivalence_confidence=0.95,
                   p_holm=0.01, learning_rate=None, **more)
    return dict(metric="val_loss", baseline="base", min_effect=0.05, comparisons=1, alpha=0.05, fork_at=None,
                variants=dict(base=dict(verdict="baseline", reasons=[dict(code="baseline")]), v=variant))


def test_every_verdict_the_engine_gives_gets_a_sentence_a_table_cell_and_a_why_line():
    verdicts = emitted("verdict") | assigned_verdicts() | {"better", "worse", "better, but negligible",
                                                            "worse, but negligible"}
    verdicts -= {"baseline"}
    assert {"equivalent", "inconclusive", "not comparable", "incomplete", "too few seeds", "deterministic",
            "not evaluated", "no answer"} <= verdicts
    for verdict in sorted(verdicts):
        report = a_report(verdict, [dict(code="no_paired_seed")])
        sentence = render.sentence(report, "v")
        assert sentence.startswith("- **v**, from scratch: ") and "None" not in sentence
        plain = verdict.split(",")[0] if verdict.startswith(("better", "worse")) else verdict
        assert plain in sentence or (verdict == "inconclusive" and "cannot be told" in sentence)
        assert render.verdict_cell(report, "v", report["variants"]["v"]) == f"**{verdict}**"
        assert render.why_line(report, "v", report["variants"]["v"]).startswith(f"- **v** (from scratch): {verdict}: ")


def test_report_json_gets_the_words_beside_the_data_and_the_data_stays_as_computed():
    report = a_report("worse", [dict(code="holm_rejects", p_holm=0.01, alpha=0.05, step_level=0.05,
                                     interval=[0.005, 0.015], confidence=0.95)])
    report.update(design_code="forked", fork_at=8, measurement_problems=[dict(code="data_changed", run="v-seed1",
                                                                             keys=["dataset"])],
                  look=dict(code="one_look", seeds=3, alpha=0.05, looks=[3], planned=None, added=None))
    before = copy.deepcopy(report)
    out = render.with_words(report)
    assert report == before  # the data is not touched
    keys = list(out)
    assert keys[keys.index("design_code") + 1] == "design" and out["design"] == render.design_text(report)
    assert keys[keys.index("look") + 1] == "sequential" and out["sequential"] == render.sequential_text(report["look"])
    assert out["measurement"] == [render.measurement_text(report["measurement_problems"][0])]
    v = out["variants"]["v"]
    assert list(v)[list(v).index("reasons") + 1] == "why" and v["why"] == render.why(report["variants"]["v"])
    assert out["variants"]["base"]["why"] == render.why(report["variants"]["base"])
    assert {k: x for k, x in v.items() if k != "why"} == report["variants"]["v"]
    json.dumps(out, allow_nan=False)


def test_a_nested_reason_and_an_answer_in_another_verdicts_place_are_worded_through():
    inner = [dict(code="confounds", confounds={"n_head": [4, 2]})]
    nested = dict(verdict="not comparable", reasons=[dict(code="main_table", verdict="not comparable", reasons=inner)])
    assert render.why(dict(reasons=inner)) in render.why(nested)
    stand = [dict(code="bridge", status="underpowered"), dict(code="fork_jump", mean=0.066, margin=0.01)]
    words = render.why(dict(reasons=stand))
    assert render.REASONS["bridge"](stand[0]) in words and render.REASONS["fork_jump"](stand[1]) in words


def test_looks_off_the_plan_are_flagged_and_a_planned_look_is_not():
    common = dict(seeds=5, alpha=0.05, looks=[3, 5], planned=[3, 5], added=None)
    assert not render.sequential_text(dict(common, code="planned_look", number=2, spent=0.04)).startswith("NOT")
    assert render.sequential_text(dict(common, code="off_plan", planned=[3, 6])).startswith("NOT AT NOMINAL ALPHA")
    unplanned = dict(common, code="unplanned_looks", planned=None, added=dict(runs=["a-seed4"], looks_before=1))
    assert render.sequential_text(unplanned).startswith("NOT AT NOMINAL ALPHA") and "a-seed4" in \
        render.sequential_text(unplanned)
    assert "0.05" in render.sequential_text(dict(common, code="one_look", looks=[5], planned=None))


def test_a_plan_is_worded_without_a_missing_number():
    beyond = stats.plan_seeds(1.0, 4, 3, 1, 0.05, 1e-4)  # ~8e8 seeds: beyond stats.MOST_SEEDS
    assert f"more than {stats.MOST_SEEDS:,}" in render.describe_plan(beyond)
    flat = render.describe_plan(stats.plan_seeds(0.0, 4, 3, 1, 0.05, 0.01))
    assert "None" not in flat and "sd 0" in flat
    plan = stats.plan_variants({"early": (0.0024, 7), "learn": (0.0032, 7), "all": None}, 8, 3, 0.05, 0.01)
    text = render.describe_plan(plan)
    assert "None" not in text and all(f"{name}: sd" in text for name in ("early", "learn"))
    assert "unplanned: all" in text and f"{plan['sd_upper']:.4g}" in text


def test_a_blocked_answer_is_quoted_with_its_simultaneous_interval_margin_or_not():
    """The headline of a blocked analysis quotes the one simultaneous interval that decided it (the
    answer keeps its contrast through bridge.ANSWER_KEYS), also without a declared margin."""
    answer = dict(verdict="inconclusive", interval=[-0.1, 0.2], interval_confidence=0.95,
                  equivalence_interval=None, equivalence_confidence=None, contrast=dict(df=2.1))
    assert "contrast" in bridge.ANSWER_KEYS
    assert render.answer_interval(answer) == ([-0.1, 0.2], 0.95, "simultaneous")
    assert render.answer_interval(dict(answer, contrast=None))[2] == "Holm step"


def test_unfinished_runs_are_worded_by_side_and_status_with_seed_ranges():
    unfinished = [dict(variant=True, seed=s, status="not run") for s in (49, 50, 51, 60)] + \
        [dict(variant=False, seed=s, status="not run") for s in (49, 50)] + [dict(variant=True, seed=7, status="failed")]
    text = render.incomplete_text(dict(unfinished=unfinished, non_finite=[dict(variant=False, seed=3)], metric="val_loss"))
    assert text == ("seeds 49-51, 60 not run, baseline seeds 49-50 not run, seed 7 failed, baseline seed 3 has a "
                    "val_loss that is not finite (counted, not dropped)")


def test_the_runs_section_names_the_code_versions_with_their_seeds():
    runs = {("base", s): dict(info=dict(code_versions=["a1" if s < 50 else "b2"])) for s in (48, 49, 50, 51)}
    runs[("ra", 50)] = dict(info=dict(code_versions=["b2"]))
    runs[("ra", 52)] = dict(info=None)
    report = dict(code_versions=compare.code_version_seeds(runs))
    assert report["code_versions"] == {"a1": [48, 49], "b2": [50, 51]}
    assert render.code_lines(report)[0] == ("The runs trained at 2 code versions, pooled across seeds (a pair split "
                                            "across two is refused as a confound): a1: seeds 48-49; b2: seeds 50-51.")
    assert render.code_lines(dict(code_versions={"a1": [1, 2]})) == ["Every run trained at code version a1.", ""]
