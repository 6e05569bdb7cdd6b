"""tools/noise_budget.py and tools/calibration.py on suites they did not write: the sources each design fixes,
the paired sd the report computes, the evaluation re-run on the windows train.py used, and the
calibration's numbers on differences whose truth is known."""
import json
import math
import os
import shutil

import numpy as np
import pytest

from tools import bench_suite_designs, calibration
import configurator
import rundir
from tools import noise_budget
import sweep
from helpers import LR, in_process, suite_args, write_suite


@pytest.fixture(scope="module")
def null_suite(data_dir, tmp_path_factory):
    """A true null with variance (swap_all against the baseline, from scratch), 4 seeds, the data order
    fixed: the final evaluation reads 3 val batches."""
    tmp = tmp_path_factory.mktemp("null")
    variants = {"base": {"model_type": "ra", "final_eval_iters": 3, **LR},
                "swap_all": {"model_type": "ra", "final_eval_iters": 3, "ra_pattern": "all", "ra_mode": "swap", **LR}}
    path, suite_dir = write_suite(tmp, variants, ["ra_pattern", "ra_mode"], seeds=(1, 2, 3, 4))
    sweep.main([*suite_args(data_dir, path), "--data_seed=7"], launch=in_process([]))
    return suite_dir


def test_the_noise_budget_names_the_fixed_source_and_gives_the_reports_sd(null_suite, capsys):
    noise_budget.main([null_suite])
    table = capsys.readouterr().out.splitlines()
    [row] = [line for line in table if line.startswith("| every run trained from scratch")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    report = json.load(open(os.path.join(null_suite, "report.json")))["variants"]["swap_all"]
    assert cells[0] == "every run trained from scratch; data order fixed (data_seed=7)"
    assert cells[1:3] == ["swap_all", "4"] and float(cells[3]) == pytest.approx(report["diff_mean"], abs=1e-4)
    assert float(cells[4]) == pytest.approx(report["diff_sd"], abs=1e-4)
    low, high = (float(x) for x in cells[5].strip("[]").split(","))
    assert low < float(cells[4]) < high


def test_the_windows_rerun_reproduces_the_logged_final_evaluation(null_suite, capsys):
    noise_budget.main([null_suite, "--windows=3,2"])
    rows = {tuple(c.strip() for c in line.strip("|").split("|")[:2]): line for line in capsys.readouterr().out.splitlines()
            if line.startswith("| swap_all")}
    report = json.load(open(os.path.join(null_suite, "report.json")))["variants"]["swap_all"]
    three = [c.strip() for c in rows[("swap_all", "3")].strip("|").split("|")]
    assert float(three[3]) == pytest.approx(report["diff_mean"], abs=1e-4)  # 3 batches: what train.py logged
    assert ("swap_all", "2") in rows


def test_calibration_on_known_differences():
    rng = np.random.default_rng(0)
    normal = calibration.calibrate(rng.normal(0.0, 0.01, 20), 0.05, 0.01, 3, 20000)
    assert normal["subsets"] == math.comb(20, 3) and normal["shapiro_p"] > 0.05
    assert normal["called"] == round(normal["called_rate"] * normal["subsets"])
    # the 80% upper bound of a 3-seed sd covers a normal sample's sd about 80% of the time
    assert 0.65 < normal["upper_covers"] < 0.95
    skewed = calibration.calibrate(rng.exponential(0.01, 20) ** 3, 0.05, 0.01, 3, 20000)
    assert skewed["shapiro_p"] < 0.01
    # Issue 40: overlapping sub-suites are not independent trials. On an exactly normal null the rate
    # over all 1140 sub-suites of 20 seeds spreads with an sd of ~2.6 points (95%: ~1.6-11.4%), four times
    # a binomial interval's; the vectorized rule is the engine's verdict; Shapiro passes t(5) data ~80%.
    assert 0.02 < normal["called_sd"] < 0.032 and normal["called_range"][0] < 0.05 < normal["called_range"][1]
    assert normal["called_range"][1] - normal["called_range"][0] > 0.08
    picks = calibration.subsets(20, 3, 20000)
    d = rng.normal(0.0, 0.01, 20)
    engine = calibration.calibrate(d, 0.05, 0.01, 3, 20000, draws=10)
    assert calibration.called_rates(d, picks, 0.05) == pytest.approx(engine["called_rate"])
    assert engine["disjoint"] == 6 and 0.7 < normal["shapiro_passes_t5"] < 0.9
    shifted = calibration.calibrate(rng.normal(0.5, 0.001, 20), 0.05, 0.01, 3, 500)
    assert shifted["subsets"] == 500 and shifted["called_rate"] == 1.0  # sampled, and every one calls it worse


def test_family_calibration_of_nulls_sharing_a_baseline():
    """k = 4 nulls against one baseline (correlated ~0.5): the engine's family-wise rate (Holm) is the
    vectorized rule's, a correct procedure's simulated range holds alpha, the mean rate over many exact
    null suites is at most alpha, and a real effect in one variant is called far outside that range."""
    rng = np.random.default_rng(1)
    d = rng.normal(0, 0.01, (4, 20)) - rng.normal(0, 0.01, 20)
    f = calibration.family_calibrate(d, 0.05, 0.01, 8, 3000, draws=200)
    assert f["k"] == 4 and f["subsets"] == 3000 and f["disjoint"] == 2 and 0.3 < f["mean_correlation"] < 0.7
    assert f["called_range"][0] <= 0.05 <= f["called_range"][1]
    assert calibration.family_called(d, calibration.subsets(20, 8, 3000), 0.05) == pytest.approx(f["called_rate"])
    suites = rng.normal(0, 1, (300, 5, 20))
    rates = calibration.family_called(suites[:, 1:] - suites[:, :1], calibration.subsets(20, 8, 200), 0.05)
    assert 0.02 < rates.mean() < 0.055  # Holm holds the family-wise rate (conservative under positive correlation)
    shifted = d.copy()
    shifted[2] += 0.02
    g = calibration.family_calibrate(shifted, 0.05, 0.01, 8, 3000, draws=50)
    assert g["called_rate"] > 0.5 and g["called_rate"] > g["called_range"][1]
    assert g["called_share_as_often"] == 0.0
    assert "**above** what a correct procedure gives" in calibration.family_markdown(g, "s", ["a", "b", "c", "d"])
    # a rate below the range is conservative, not a failure: the calibration guards against too many calls
    low = dict(f, called_rate=f["called_range"][0] / 2, called_share_as_often=0.99)
    assert "below the range of a correct procedure (99.0% of the simulated suites call at least as often): " \
           "conservative" in calibration.family_markdown(low, "s", ["a", "b", "c", "d"])


def test_the_forked_design_calls_no_more_than_alpha_on_its_real_true_null():
    """Issue 40: the committed forked calibration (reports/calibration_forked_shakespeare: 20 seeds, four
    branches continued on other batch orders after a shared trunk). The report calls every null
    equivalent, and the family-wise rate of 8-seed sub-suites under Holm is not above what a correct
    procedure gives on normal nulls with the same covariance (it sits at the low end: conservative)."""
    report = json.load(open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "reports",
                                         "calibration_forked_shakespeare", "report.json")))
    nulls = [f"order{k}" for k in range(1, 5)]
    assert all(report["variants"][v]["verdict"] == "equivalent" for v in nulls)
    diffs = [report["variants"][v]["differences"] for v in nulls]
    assert {len(d) for d in diffs} == {20}
    f = calibration.family_calibrate(diffs, 0.05, 0.01, 8, 2000, draws=200)
    assert f["called_rate"] <= f["called_range"][1] and f["called_share_as_often"] > 0.5
    assert f["called_rate"] < 0.05 and 0.2 < f["mean_correlation"] < 0.5


def test_calibration_needs_one_comparison_with_more_seeds_than_a_pilot(null_suite, tmp_path, capsys):
    calibration.main([null_suite, "--pilot_seeds=3", f"--out={tmp_path}", "--null_keys=ra_pattern,ra_mode"])
    out = capsys.readouterr().out
    assert "True null `swap_all` against the baseline, 4 paired seeds" in out and "of 4 called better or worse" in out
    assert os.path.getsize(tmp_path / "qq.png") > 1000
    with pytest.raises(configurator.ConfigError, match="more paired seeds than --pilot_seeds=4"):
        calibration.main([null_suite, "--pilot_seeds=4", f"--out={tmp_path}", "--null_keys=ra_pattern,ra_mode"])


def test_calibration_refuses_a_suite_whose_variants_are_real(null_suite, tmp_path, capsys):
    """Issue 50: on the RA suite, whose variants are real, the tool printed "True null `late` ..." and
    false-positive rates. Only the seed and the batch order (data_order) may differ, unless the user names
    the keys of a difference that is a null in distribution (swap_all: a relabelling of W_q and W_k)."""
    with pytest.raises(configurator.ConfigError) as refused:
        calibration.main([null_suite, f"--out={tmp_path}"])
    assert str(refused.value) == (
        f"{null_suite}: swap_all differs from the baseline in ra_mode='swap' (baseline 'mix'), ra_pattern='all' "
        f"(baseline 'none'), not only in batch order (data_order) or seed, so it is no true null: calibrate a "
        f"true-null suite (suites/calibration_*.py), or, if that difference is a null in distribution (swap_all's "
        f"relabelling), pass --null_keys=ra_mode,ra_pattern")
    assert capsys.readouterr().out == "" and not os.path.exists(tmp_path / "qq.png")


def test_the_bench_never_removes_a_directory_it_did_not_create(tmp_path, monkeypatch):
    mine = tmp_path / "results"
    mine.mkdir()
    (mine / "notes.txt").write_text("the user's own file")
    with pytest.raises(configurator.ConfigError, match="--seeds='abc': distinct integers"):
        bench_suite_designs.main([f"--out={mine}", "--seeds=abc"])
    for out in (str(mine), "."):
        with pytest.raises(rundir.RunDirError, match="exists and holds no list of files written by "
                                                     "bench_suite_designs.py: nothing was deleted"):
            bench_suite_designs.main([f"--out={out}", "--seeds=1"])
    assert (mine / "notes.txt").read_text() == "the user's own file"
    with pytest.raises(rundir.RunDirError, match="--out is empty"):
        bench_suite_designs.main(["--out="])
    with pytest.raises(rundir.RunDirError, match="is a file"):
        bench_suite_designs.main([f"--out={mine / 'notes.txt'}"])
    monkeypatch.setattr(bench_suite_designs, "run_design", fake_design)
    own = tmp_path / "bench"
    bench_suite_designs.main([f"--out={own}", "--seeds=1"])
    (own / "ra_shakespeare" / "baseline-seed1" / "log.jsonl").write_text("an earlier bench's run")
    bench_suite_designs.main([f"--out={own}", "--seeds=1"])  # its own directory: its files replaced
    assert (own / "ra_shakespeare" / "baseline-seed1" / "log.jsonl").read_text() == "this bench's run"


def fake_design(suite, extra, seeds, sweep_dir):
    """Instead of a timed sweep: one run's log in the design's suite directory."""
    os.makedirs(os.path.join(sweep_dir, "baseline-seed1"))
    with open(os.path.join(sweep_dir, "baseline-seed1", "log.jsonl"), "w") as f:
        f.write("this bench's run")
    return 60.0, 1


def test_the_bench_removes_only_the_files_it_listed_even_in_a_copy_or_through_a_link(tmp_path, monkeypatch):
    """Issue 50: a copied bench directory (its marker inside) with the user's notes added was removed
    whole; --out as a symbolic link to a bench directory was a traceback."""
    monkeypatch.setattr(bench_suite_designs, "run_design", fake_design)
    bench, copy, link = tmp_path / "bench", tmp_path / "copy", tmp_path / "link"
    bench_suite_designs.main([f"--out={bench}", "--seeds=1"])
    shutil.copytree(bench, copy)
    (copy / "notes.md").write_text("the user's notes")
    (copy / "ra_shakespeare" / "my_plot.png").write_text("the user's plot")
    link.symlink_to(copy)
    for out in (copy, link):
        bench_suite_designs.main([f"--out={out}", "--seeds=1"])
        assert (copy / "notes.md").read_text() == "the user's notes"
        assert (copy / "ra_shakespeare" / "my_plot.png").read_text() == "the user's plot"
        assert (copy / "bench_suite.json").exists() and link.is_symlink()
    listed = json.load(open(copy / rundir.TOOL_MANIFEST))["files"]
    assert "notes.md" not in listed and "ra_shakespeare/my_plot.png" not in listed
    # a manifest that names files outside its directory never reaches them
    (tmp_path / "outside.txt").write_text("kept")
    with open(copy / rundir.TOOL_MANIFEST, "w") as f:
        json.dump(dict(tool="bench_suite_designs.py", files=["../outside.txt", "../copy/../outside.txt"]), f)
    shutil.rmtree(copy / "ra_shakespeare")
    shutil.rmtree(copy / "ra_shakespeare_forked")
    bench_suite_designs.main([f"--out={copy}", "--seeds=1"])
    assert (tmp_path / "outside.txt").read_text() == "kept"


def test_the_noise_tools_name_what_is_not_a_suite_and_refuse_nonsense_options(null_suite, tmp_path):
    a_file = tmp_path / "notes.txt"
    a_file.write_text("x")
    ladder_dir, empty = tmp_path / "ladder", tmp_path / "empty"
    for d, declared in ((ladder_dir, dict(ladder=dict(sizes={"w32": {}, "w64": {}}))),
                        (empty, dict(runs={"base-seed1": ["base", 1], "v-seed1": ["v", 1]}))):
        d.mkdir()
        (d / "suite.json").write_text(json.dumps(dict(dict(name="s", metric="val_loss", baseline="base", allowed=[],
                                                           runs={}), **declared)))
    cases = [([str(tmp_path / "gone")], "does not exist"), ([str(a_file)], "is a file, not a suite directory"),
             ([os.path.join(null_suite, "base-seed1")], "is one run's directory, not a suite"),
             ([str(ladder_dir)], f"is a ladder of 2 sizes \\(w32, w64\\).*give one size, e.g. {ladder_dir}/w32"),
             ([null_suite, "--windows=abc"], "--windows='abc': val batch counts >= 1"),
             ([null_suite, "--windows=0"], "--windows='0'"), ([null_suite, "--slots=0"], "--slots=0"),
             ([null_suite, "--hour_s=-1"], "--hour_s=-1"),
             ([str(empty)], "no variant has two paired seeds that finished")]
    for argv, message in cases:
        with pytest.raises(configurator.ConfigError, match=message):
            noise_budget.main(argv)
    for argv, message in (([str(a_file)], "is a file, not a suite directory"),
                          ([str(ladder_dir)], "is a ladder of 2 sizes"),
                          ([null_suite, "--max_subsets=0"], "--max_subsets=0"),
                          ([null_suite, f"--out={a_file}"], "is a file: name a directory")):
        with pytest.raises(configurator.ConfigError, match=message):
            calibration.main(argv)


def test_the_noise_budget_says_what_its_degrees_of_freedom_support_and_names_shared_seeds():
    """Issue 40: a 4-seed row has 3 df: its sd ratio to a 20-seed row spans ~0.5-3.4 at 95%, so 'fixing
    one source does not help' cannot be read from it; and a row with data_seed=1 runs seed 1 exactly as
    the row that fixes nothing."""
    from scipy import stats as sps
    low, high = noise_budget.ratio_interval(1.0, 3, 1.0, 19)
    assert low < 0.55 and high > 3.0
    assert noise_budget.ratio_interval(1.0, 3, 1.0, 19) == pytest.approx(
        (1 / math.sqrt(sps.f.ppf(0.975, 3, 19)), 1 / math.sqrt(sps.f.ppf(0.025, 3, 19))))
    designs = [dict(dir="all", fixed={}, seeds=list(range(1, 21))),
               dict(dir="data-fixed", fixed={"data_seed": 1}, seeds=[1, 2, 3, 4]),
               dict(dir="init-fixed", fixed={"init_seed": 7}, seeds=[1, 2, 3, 4])]
    [line] = noise_budget.shared_seeds(designs)
    assert line.startswith("- seed 1 of data-fixed (data_seed=1) is the same pair of runs as seed 1 of all")
