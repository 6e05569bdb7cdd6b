"""The sequential blocked analysis (stats.sequential_blocked, a suite's `stop_decided`): which arm a look stops,
the family-wise rate and the final intervals' coverage by simulation, and sweep.py running look by look."""
import json
import os

import numpy as np
import pytest

import configurator
import runtime
import sweep
from ablation import compare, plan, stats, suites
from helpers import Finished, toy_args

LOOKS = [3, 5, 8]
LEVELS = compare.spent_per_look(LOOKS, 0.05)
FLAGSHIP = [0.0124, 0.0073, 0.0085, 0.0095, 0.0105]  # tools/calibrate_analysis.py: the measured arm sds
SEED_SD = 0.0048


def test_the_looks_spend_alpha_by_obrien_fleming_and_sum_to_it():
    cumulative = np.cumsum(LEVELS)
    assert cumulative[-1] == pytest.approx(0.05)
    assert cumulative == pytest.approx([compare.obrien_fleming_spent(n / 8, 0.05) for n in LOOKS])
    assert LEVELS[0] < LEVELS[1] < LEVELS[2]


@pytest.mark.parametrize("interval, min_effect, code", [
    ((-0.004, 0.006), 0.01, "within_margin"), ((0.012, 0.05), 0.01, "beyond_margin"),
    ((-0.09, -0.01), 0.01, "beyond_margin"), ((0.002, 0.02), 0.01, None), ((-0.02, 0.001), 0.01, None),
    ((0.001, 0.02), None, "excludes_zero"), ((-0.001, 0.02), None, None)])
def test_an_interval_decides_its_arm_inside_or_wholly_beyond_the_margin(interval, min_effect, code):
    assert stats.stop_code(interval, min_effect) == code


@pytest.mark.parametrize("interval, code", [((0.012, 0.05), None), ((0.012, 0.03), "beyond_margin"),
                                            ((-0.009, 0.009), "within_margin"), ((-0.005, 0.0201), None)])
def test_with_a_half_width_only_a_narrow_enough_interval_decides(interval, code):
    assert stats.stop_code(interval, 0.01, max_half_width=0.01) == code


def constructed_table(effects=(0.0, 0.2, 0.012), seeds=8):
    """Baseline, an arm far worse than the margin (0.2), an arm near it (0.012): the seed effect shared."""
    rng = np.random.default_rng(5)
    seed_effect = rng.normal(0, 0.01, seeds)
    noise = rng.normal(0, 1, (3, seeds)) * np.array([[0.006], [0.005], [0.008]])
    return 2.0 + seed_effect + noise + np.array(effects)[:, None]


def test_a_decided_arm_stops_at_its_look_and_the_open_one_goes_on():
    y = constructed_table()
    taken, final = stats.sequential_blocked(y, LOOKS, LEVELS, min_effect=0.01)
    assert [(look["seeds"], look["tested"], look["stopped"]) for look in taken] == [
        (3, [1, 2], [1]), (5, [2], []), (8, [2], [])]
    assert (final[1]["look_number"], final[1]["seeds"], final[1]["stop"]) == (1, 3, "beyond_margin")
    assert (final[2]["look_number"], final[2]["seeds"], final[2]["stop"]) == (3, 8, None)
    assert final[1]["interval"][0] > 0.01 and final[2]["interval"][0] < 0.01 < final[2]["interval"][1]
    # the stopped arm's later seeds are never read: without them the replay is the same
    y[1, 3:] = np.nan
    assert stats.sequential_blocked(y, LOOKS, LEVELS, min_effect=0.01) == (taken, final)
    # a look is taken only when the baseline and every open arm have its seeds
    y[2, 6] = np.nan
    assert [look["seeds"] for look in stats.sequential_blocked(y, LOOKS, LEVELS, min_effect=0.01)[0]] == [3, 5]


def test_a_decided_arm_wider_than_the_half_width_runs_on_to_a_look_where_it_is_narrow_enough():
    y = constructed_table()
    taken, final = stats.sequential_blocked(y, LOOKS, LEVELS, min_effect=0.01, max_half_width=0.02)
    # at 3 seeds the far arm is decided (wholly beyond the margin) but ±0.117 wide; at 5 it is ±0.016
    assert [(look["seeds"], look["tested"], look["stopped"]) for look in taken] == [
        (3, [1, 2], []), (5, [1, 2], [1]), (8, [2], [])]
    low, high = final[1]["interval"]
    assert final[1]["seeds"] == 5 and low > 0.01 and (high - low) / 2 <= 0.02
    # narrower than any look reaches: it runs every seed, and its verdict is read at the last look
    decisions, taken = stats.judge_sequential(y, LOOKS, LEVELS, "lower", 0.01, max_half_width=0.005)
    assert [look["stopped"] for look in taken] == [[], [], []]
    assert (decisions[0]["verdict"], decisions[0]["seeds_used"]) == ("worse", 8)
    assert decisions[0]["reasons"][-1]["code"] == "open_at_look"


def test_an_arm_equivalent_within_the_margin_stops_too():
    y = constructed_table(effects=(0.0, 0.0, 0.012))
    decisions, taken = stats.judge_sequential(y, LOOKS, LEVELS, "lower", min_effect=0.1)
    # at 3 seeds O'Brien-Fleming's 0.00137 leaves the intervals wider than ±0.1; at 5 both lie inside: the suite ends
    assert [look["stopped"] for look in taken] == [[], [1, 2]]
    assert [d["verdict"] for d in decisions] == ["equivalent", "equivalent"]
    assert decisions[0]["reasons"][-1]["stop"] == "within_margin" and decisions[0]["seeds_used"] == 5


def test_one_look_is_the_fixed_blocked_analysis_and_a_stopped_arm_stays_in_the_family():
    y = constructed_table()
    _, final = stats.sequential_blocked(y, [8], [0.05], min_effect=0.01)
    fixed = stats.blocked_test(y, 0.05, min_effect=0.01)["contrasts"]
    for arm, contrast in enumerate(fixed, start=1):
        assert {k: final[arm][k] for k in contrast} == contrast
    # the family's largest |t| runs over all k planned contrasts: a stopped arm raises the critical value
    alone = stats.blocked_test(y[[0, 2]], 0.05)["critical"]
    kept = stats.blocked_test(y[[0, 2]], 0.05, absent_sds=[0.005])["critical"]
    assert kept > alone


def test_the_verdicts_say_at_which_look_each_arm_stopped():
    decisions, taken = stats.judge_sequential(constructed_table(), LOOKS, LEVELS, "lower", min_effect=0.01)
    far, near = decisions
    assert far["verdict"] == "worse" and far["look_number"] == 1 and far["seeds_used"] == 3
    assert far["interval_confidence"] == pytest.approx(1 - LEVELS[0])
    assert [r["code"] for r in far["reasons"]] == ["blocked_rejects", "beyond_margin", "stopped_at_look"]
    assert far["reasons"][-1] == dict(code="stopped_at_look", look_number=1, looks=3, seeds=3, level=LEVELS[0],
                                      stop="beyond_margin")
    assert near["verdict"] == "inconclusive" and near["reasons"][-1]["code"] == "open_at_look"
    assert near["interval_confidence"] == pytest.approx(1 - LEVELS[2])


def test_simulated_family_wise_rate_and_final_coverage_hold_the_level():
    """A small seeded simulation (tools/calibrate_analysis.py runs the large one): under a heteroscedastic null
    (the baseline twice as noisy as the variants) the share of tables in which any arm is called better or worse
    at any look is within 3 Monte Carlo se of alpha or below; with one arm far beyond the margin (stopped early)
    every final interval covers its true effect at least 1 - alpha - 3 se of the time."""
    rng, tables = np.random.default_rng(58), 300
    variant = float(np.mean(FLAGSHIP[1:]))
    null = stats.simulate_tables([2 * variant] + [variant] * 4, SEED_SD, LOOKS[-1], tables, rng)
    called, covered, _ = stats.simulate_sequential(null, LOOKS, LEVELS, 0.01, draws=2000)
    se = np.sqrt(0.05 * 0.95 / tables)
    assert called.mean() <= 0.05 + 3 * se and covered.mean() >= 0.95 - 3 * se
    # asking for resolution too (stop_half_width) keeps arms open longer, never past the level
    called, covered, _ = stats.simulate_sequential(null, LOOKS, LEVELS, 0.01, draws=2000, max_half_width=0.01)
    assert called.mean() <= 0.05 + 3 * se and covered.mean() >= 0.95 - 3 * se
    effects = [0.05, 0.0, 0.005, 0.0]
    shifted = stats.simulate_tables(FLAGSHIP, SEED_SD, LOOKS[-1], tables, rng, effects)
    _, covered, seeds = stats.simulate_sequential(shifted, LOOKS, LEVELS, 0.01, effects, draws=2000)
    assert seeds[:, 0].mean() < 6 and (seeds[:, 1:] == 8).mean() > 0.9  # the far arm stops early, the others run
    assert covered.mean() >= 0.95 - 3 * se


# ----------------------------------------------------------------------------- the suite key and sweep.py

FACTS = dict(dataset_fingerprint="d", tokenizer="t", eval_windows="w", data_order="o", init_weights={})
EFFECT = {1e-3: 0.0, 2e-3: 0.2, 3e-3: 0.012}  # a variant's learning rate -> its effect: base, far, near
NOISE = constructed_table(effects=(0.0, 0.0, 0.0)) - 2.0  # fixed per (arm, seed)


def fake_runs(calls):
    """A launcher that writes a finished run directory (config, run record, log) instead of training: its value
    the constructed table's (arm by learning rate, seed 1-8)."""
    def launch(argv, gpu, log_path):
        cfg = configurator.apply_config(runtime.DEFAULTS, argv)
        calls.append(os.path.basename(cfg["out_dir"]))
        arm = list(EFFECT).index(cfg["learning_rate"])
        value = 2.0 + EFFECT[cfg["learning_rate"]] + NOISE[arm, cfg["seed"] - 1]
        for name, body in (("config.json", cfg), ("run_info.json", dict(facts=FACTS, resumes=[], code_versions=["x"]))):
            with open(os.path.join(cfg["out_dir"], name), "w") as f:
                json.dump(body, f)
        with open(os.path.join(cfg["out_dir"], "log.jsonl"), "w") as f:
            for i, v in enumerate([3.0, value]):
                f.write(json.dumps(dict(event="eval", iter=i, tokens=1000 * i, val_loss=v)) + "\n")
            f.write(json.dumps(dict(event="end", iter=1, tokens=1000, stop_reason="max_iters")) + "\n")
        return Finished(0)
    return launch


def write_sequential_suite(tmp_path, extra="stop_decided = True\nlooks = [3, 5, 8]\n"):
    path = tmp_path / "suite_seq.py"
    path.write_text("variants = {'base': {'learning_rate': 1e-3}, 'far': {'learning_rate': 2e-3}, "
                    "'near': {'learning_rate': 3e-3}}\nbaseline = 'base'\nseeds = [1, 2, 3, 4, 5, 6, 7, 8]\n"
                    f"metric = 'val_loss'\nmin_effect = 0.01\nallowed = ['learning_rate']\n"
                    f"suite_dir = {str(tmp_path / 'out-seq')!r}\n{extra}")
    return str(path), str(tmp_path / "out-seq")


def test_a_sweep_stops_the_decided_arm_and_a_rerun_resumes_without_it(data_dir, tmp_path, capsys):
    path, suite_dir = write_sequential_suite(tmp_path)
    calls = []
    sweep.main([path, *toy_args(data_dir)], launch=fake_runs(calls))
    assert calls == [f"{v}-seed{s}" for s in (1, 2, 3) for v in ("base", "far", "near")] + \
        [f"{v}-seed{s}" for s in range(4, 9) for v in ("base", "near")]
    record = [json.loads(line) for line in open(os.path.join(suite_dir, "suite_record.jsonl"))]
    assert [(e["event"], e["seeds"], e.get("stopped")) for e in record] == [
        ("look", 3, ["far"]), ("look", 5, []), ("look", 8, []), ("look", 8, None)]  # the last: the report's own
    report = json.load(open(os.path.join(suite_dir, "report.json")))
    far, near = report["variants"]["far"], report["variants"]["near"]
    assert (far["verdict"], far["n"], far["look_number"]) == ("worse", 3, 1)
    assert report["stopped"] == {"far": dict(look_number=1, seeds=3, runs=[f"far-seed{s}" for s in range(4, 9)])}
    assert (near["verdict"], near["n"], near["look_number"]) == ("inconclusive", 8, 3)
    assert report["variants"]["base"]["n"] == 8
    assert [look["stopped"] for look in report["blocked_analysis"]["sequential"]] == [["far"], [], []]
    text = open(os.path.join(suite_dir, "report.md")).read()
    assert "stopped at look 1" in text and "not run" not in text
    # the column that decides is named for the p it holds: the blocked analysis's is simultaneous, not Holm's
    assert "| p | p (simultaneous) |" in text and "The p (simultaneous) column holds each arm's" in text
    assert "p (Holm)" not in text
    # the same command again: nothing runs, nothing is added, no look is taken twice (the rebuilt report at the
    # same seed count is no new look)
    calls.clear()
    capsys.readouterr()
    sweep.main([path, *toy_args(data_dir)], launch=fake_runs(calls))
    assert calls == [] and "stale" not in capsys.readouterr().out  # the stopped seeds were never there
    again = [json.loads(line) for line in open(os.path.join(suite_dir, "suite_record.jsonl"))]
    assert again[:len(record)] == record and [(e["event"], e["seeds"], e.get("stopped")) for e in again[len(record):]
                                              ] == [("look", 8, None)]
    assert json.load(open(os.path.join(suite_dir, "report.json")))["variants"]["far"]["n"] == 3
    # --status counts the stopped arm's later seeds as never run, not as waiting, and builds the report
    capsys.readouterr()
    sweep.main([path, *toy_args(data_dir), "--status=True"])
    status = capsys.readouterr().out
    assert "far: stopped at look 1 (3 seeds), decided" in status and "every run has finished" in status
    assert "far-seed4" not in status


def test_a_half_width_set_after_a_look_is_recorded_and_keeps_the_decided_arm_running(data_dir, tmp_path, capsys):
    """The long suite's case: a look taken (nothing stopped), the sweep paused, the suite file then asks for
    resolution too. The narrowing is accepted once, recorded with the looks before it, and the far arm, decided
    at look 1 but ±0.117 wide, runs on to look 2 (±0.016 <= 0.02)."""
    path, suite_dir = write_sequential_suite(tmp_path)
    calls, finish = [], fake_runs([])

    def paused_after_three(argv, gpu, log_path):
        cfg = configurator.apply_config(runtime.DEFAULTS, argv)
        calls.append(os.path.basename(cfg["out_dir"]))
        return finish(argv, gpu, log_path) if cfg["seed"] <= 3 else Finished(sweep.EXIT_PAUSED)

    with pytest.raises(RuntimeError, match="paused"):
        sweep.main([path, *toy_args(data_dir)], launch=paused_after_three)
    record = [json.loads(line) for line in open(os.path.join(suite_dir, "suite_record.jsonl"))]
    assert [(e["seeds"], e["stopped"]) for e in record if "stopped" in e] == [(3, ["far"])]
    # a stopped arm cannot be reopened by a narrower rule: the runs it skipped were never made
    with open(path, "a") as f:
        f.write("stop_half_width = 0.02\n")
    calls.clear()
    with pytest.raises(configurator.ConfigError, match=r"only while no arm has stopped \(far did\)") as refused:
        sweep.main([path, *toy_args(data_dir)], launch=fake_runs(calls))
    assert "\n" not in str(refused.value) and calls == []
    # the same pause where look 1 stopped nothing (its record line as a rule without resolution would leave it)
    with open(os.path.join(suite_dir, "suite_record.jsonl"), "w") as f:
        f.write(json.dumps(dict(record[0], stopped=[])) + "\n")
    calls.clear()
    sweep.main([path, *toy_args(data_dir)], launch=fake_runs(calls))
    assert calls == [f"{v}-seed{s}" for s in (4, 5) for v in ("base", "far", "near")] + \
        [f"{v}-seed{s}" for s in (6, 7, 8) for v in ("base", "near")]
    record = [json.loads(line) for line in open(os.path.join(suite_dir, "suite_record.jsonl"))]
    assert [(e["event"], e.get("looked_at"), e.get("stop_half_width")) for e in record][:2] == [
        ("look", None, None), ("stop_half_width", [3], 0.02)]
    report = json.load(open(os.path.join(suite_dir, "report.json")))
    far = report["variants"]["far"]
    assert (far["verdict"], far["n"], far["look_number"], report["stop_half_width"]) == ("worse", 5, 2, 0.02)
    assert report["stopped"]["far"]["runs"] == [f"far-seed{s}" for s in (6, 7, 8)]
    text = open(os.path.join(suite_dir, "report.md")).read()
    assert "decides it and is at most ±0.02 wide (half-width) stops" in text
    assert "The half-width condition (±0.02) was set after the look(s) at 3 seeds" in text
    # once recorded it is not recorded again; widening it back is refused
    sweep.main([path, *toy_args(data_dir)], launch=fake_runs(calls))
    assert sum(e["event"] == "stop_half_width" for e in map(json.loads, open(os.path.join(
        suite_dir, "suite_record.jsonl")))) == 1
    with open(path, "a") as f:
        f.write("stop_half_width = 0.05\n")
    with pytest.raises(configurator.ConfigError, match=r"at half-width 0.02; this suite says 0.05: it may only narrow"):
        sweep.main([path, *toy_args(data_dir)], launch=fake_runs(calls))


def paused_after(last_seed, calls):
    """A launcher that finishes the runs up to `last_seed` and pauses the later ones (nothing written)."""
    finish = fake_runs([])

    def launch(argv, gpu, log_path):
        cfg = configurator.apply_config(runtime.DEFAULTS, argv)
        calls.append(os.path.basename(cfg["out_dir"]))
        return finish(argv, gpu, log_path) if cfg["seed"] <= last_seed else Finished(sweep.EXIT_PAUSED)
    return launch


def test_a_report_between_looks_shows_the_looks_taken_and_adds_none(data_dir, tmp_path):
    """report.py on a sequential suite mid-way: the stopped arm has its verdict; the open one has none, but what
    its last look saw (the replay's own interval there) and the look it goes on to; the header reads that look,
    never the seed count between looks, and the report adds no look to the record."""
    path, suite_dir = write_sequential_suite(tmp_path)
    with pytest.raises(RuntimeError, match="paused"):
        sweep.main([path, *toy_args(data_dir)], launch=paused_after(4, []))
    report = json.load(open(suites.report_suite_dir(suite_dir).replace("report.md", "report.json")))
    record = [json.loads(line) for line in open(os.path.join(suite_dir, "suite_record.jsonl"))]
    assert {e["seeds"] for e in record} == {3}  # the look taken, and the reports' own at it: none at 4 seeds
    assert (report["looked_at_seeds"], report["look"]["code"], report["look"]["number"]) == (3, "planned_look", 1)
    far, near = report["variants"]["far"], report["variants"]["near"]
    assert (far["verdict"], far["look_number"]) == ("worse", 1)
    assert near["verdict"] == "incomplete" and near["n"] == 4  # seed 4 finished, seeds 5-8 not run
    interim = near["reasons"][-1]
    value = lambda arm, s: (report["variants"][arm]["runs"].get(f"seed{s}") or {}).get("value")
    table = np.array([[value(arm, s) for s in range(1, 5)] for arm in ("base", "far", "near")], dtype=np.float64)
    decisions, _ = stats.judge_sequential(table, LOOKS, LEVELS, "lower", 0.01)
    expected = decisions[1]  # near, open after look 1 (its seed 5 is still to run)
    assert (interim["code"], interim["look_number"], interim["seeds"], interim["next_seeds"]) == ("interim", 1, 3, 5)
    assert interim["interval"] == expected["interval"] and not interim["stop"]
    assert [(look["seeds"], look["tested"], look["stopped"]) for look in report["blocked_analysis"]["sequential"]
            ] == [(3, ["far", "near"], ["far"])]
    text = open(os.path.join(suite_dir, "report.md")).read()
    assert "Looks: look 1 at 3 seeds" in text and "none yet" not in text and "NOT AT NOMINAL" not in text
    assert "not decided, it runs on to look 2 (5 seeds)" in text


def test_a_report_before_the_first_look_reads_no_test(data_dir, tmp_path):
    path, suite_dir = write_sequential_suite(tmp_path)
    with pytest.raises(RuntimeError, match="paused"):
        sweep.main([path, *toy_args(data_dir)], launch=paused_after(2, []))
    report = json.load(open(suites.report_suite_dir(suite_dir).replace("report.md", "report.json")))
    assert report["look"]["code"] == "before_first_look" and report["blocked_analysis"]["sequential"] == []
    assert all(v["verdict"] in ("baseline", "incomplete") for v in report["variants"].values())
    assert not os.path.exists(os.path.join(suite_dir, "suite_record.jsonl"))  # no test read, so no look
    assert "no look yet: the first of the 3 declared before the runs is at 3 seeds" in open(
        os.path.join(suite_dir, "report.md")).read()


def test_a_look_waits_for_every_open_arm_and_never_tests_without_one(data_dir, tmp_path):
    """An open arm's run missing inside a look's seeds holds the look: the other arm is not tested in a smaller
    family (whose critical value would be too small), and its report says what it waits for."""
    path, suite_dir = write_sequential_suite(tmp_path)
    finish = fake_runs([])

    def near_seed2_paused(argv, gpu, log_path):
        cfg = configurator.apply_config(runtime.DEFAULTS, argv)
        held = cfg["learning_rate"] == 3e-3 and cfg["seed"] == 2
        return Finished(sweep.EXIT_PAUSED) if held else finish(argv, gpu, log_path)

    with pytest.raises(RuntimeError, match="paused"):
        sweep.main([path, *toy_args(data_dir)], launch=near_seed2_paused)
    report = json.load(open(suites.report_suite_dir(suite_dir).replace("report.md", "report.json")))
    far, near = report["variants"]["far"], report["variants"]["near"]
    assert report["blocked_analysis"]["sequential"] == [] and far["n"] == 3
    assert far["verdict"] == "incomplete" and far["reasons"][-1] == dict(code="look_waits", seeds=3, arms=["near"])
    assert near["verdict"] == "incomplete" and near["reasons"][-1]["code"] == "unfinished"
    assert not os.path.exists(os.path.join(suite_dir, "suite_record.jsonl"))
    assert "a look is taken only when every open arm has its seeds: it waits for the runs still to finish in near" \
        in open(os.path.join(suite_dir, "report.md")).read()


@pytest.mark.parametrize("extra, message", [
    ("stop_decided = True\n", r"stop_decided with looks=None and 8 seeds: declare the looks"),
    ("stop_half_width = 0.01\nlooks = [3, 8]\n", r"stop_half_width=0.01: the widest .* with stop_decided = True"),
    ("stop_decided = True\nlooks = [3, 8]\nstop_half_width = -1\n", r"stop_half_width=-1: the widest"),
    ("stop_decided = True\nlooks = [3, 5]\n", r"the last at the suite's seed count"),
    ("stop_decided = 'yes'\nlooks = [3, 8]\n", r"stop_decided='yes': True"),
    ("stop_decided = True\nlooks = [3, 8]\nanalysis = 'paired'\n", r"stop_decided needs the blocked analysis"),
])
def test_a_wrong_stopping_rule_is_one_line_before_anything_runs(data_dir, tmp_path, extra, message):
    path, suite_dir = write_sequential_suite(tmp_path, extra)
    with pytest.raises(configurator.ConfigError, match=message) as refused:
        sweep.main([path, *toy_args(data_dir), "--dry_run=True"])
    assert "\n" not in str(refused.value) and not os.path.exists(suite_dir)


def test_the_planner_says_at_which_look_a_budget_ends():
    assert plan.looks_in_budget([3, 5, 8], 6) == ("  looks [3, 5, 8]: the budget ends after look 2 (5 seeds) if no arm "
                                                  "stops; the last look needs 8 seeds of the arms still open")
    assert plan.looks_in_budget([3, 5, 8], 8).endswith("after look 3 (8 seeds) if no arm stops")
    assert "ends before the first look (3 seeds)" in plan.looks_in_budget([3, 5, 8], 2)
