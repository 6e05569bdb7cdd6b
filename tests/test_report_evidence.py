"""What a report rests on (ablation/compare.py): per-seed evidence and the exact sign-flip test, cost that
adds up, FLOPs per token, the compute-matched view, HellaSwag compared item by item, and what a run
records for them (load average, FLOPs per token, per-example HellaSwag scores)."""
import itertools
import json
import os

import numpy as np
import pytest

import evaluation
import hellaswag
import rundir
import train
from ablation import compare, render, stats
from ra_model import RAGPT, RAConfig
from helpers import FIXTURE, tiny_args, tiny_gpt, write_jsonl


def enumerated_sign_flip_p(d):
    """The two-sided sign-flip p by hand: the share of the 2^n sign patterns whose mean is at least
    as far from 0, on the same side, as the observed one, doubled (the null is symmetric)."""
    d = np.asarray(d, dtype=np.float64)
    means = np.array([np.mean(d * signs) for signs in itertools.product((1, -1), repeat=len(d))])
    observed = d.mean()
    tail = min(np.mean(means >= observed - 1e-12), np.mean(means <= observed + 1e-12))
    return min(1.0, 2 * tail)


@pytest.mark.parametrize("diffs", [[-0.03, -0.02, -0.05], [0.01, -0.004, 0.02, 0.015], [0.0, 0.02, -0.01],
                                   [-0.01, -0.02, -0.015, -0.03, -0.012, -0.001]])
def test_sign_flip_p_equals_the_enumeration_of_every_sign_pattern(diffs):
    result = stats.sign_flip_test(diffs)
    assert result["p"] == pytest.approx(enumerated_sign_flip_p(diffs), abs=1e-12)
    assert (result["below"], result["above"], result["zero"]) == (
        sum(d < 0 for d in diffs), sum(d > 0 for d in diffs), sum(d == 0 for d in diffs))


def test_three_seeds_of_one_sign_give_a_quarter_and_six_give_one_in_thirty_two():
    assert stats.sign_flip_test([-0.03, -0.02, -0.05])["p"] == pytest.approx(0.25)
    assert stats.sign_flip_test([-1, -2, -3, -4, -5, -6])["p"] == pytest.approx(2 / 64)
    assert stats.sign_flip_test([0.2]) == dict(below=0, above=1, zero=0, p=None)  # one seed: no test


# ----------------------------------------------------------------------------- synthetic run directories

def fake_run(out_dir, value_at, windows_ms, tokens_per_iter=100, iters=50, flops_per_token=1000, parameters=10,
             every=500, status_end=True, loads=(0.5,)):
    """A run as read_run returns it: evaluations every `every` tokens of value_at(tokens), a train
    record per logged window (step_time_ms), a checklist and an end event whose train_time is the
    sum of the windows' step times (10 steps each)."""
    tokens = tokens_per_iter * iters
    events = [dict(event="checklist", parameters=parameters, flops_per_token=flops_per_token,
                   tokens_per_iter=tokens_per_iter)]
    events += [dict(event="eval", tokens=t, val_loss=value_at(t)) for t in range(0, tokens + 1, every)]
    events += [dict(event="train", step_time_ms=ms, tokens_per_sec=tokens_per_iter / ms * 1000, peak_memory_mib=64.0,
                    load_average=[loads[i % len(loads)], 0, 0]) for i, ms in enumerate(windows_ms)]
    train_time = sum(10 * ms / 1000 for ms in windows_ms)
    if status_end:
        events.append(dict(event="end", tokens=tokens, train_time=train_time))
    return dict(out_dir=str(out_dir), config=None, info=None, events=events)


def compared(runs, variants, baseline="base", schedule_end=None):
    """compare.add_evidence on a report whose comparison part is filled in by hand (the runs have no
    configs: only what the evidence needs); schedule_end: the runs whose schedule ends at equal FLOPs."""
    report = dict(metric="val_loss", goal="lower", baseline=baseline, hellaswag_tokens=None, level=0.05, alpha=0.05,
                  min_effect=None,
                  compared_at_tokens=compare.common_tokens(list(runs.values()), "val_loss"),
                  variants={v: {} for v in variants})
    for run in runs.values():
        run["status"] = "finished"
    for v, seeds in variants.items():
        if v != baseline:
            at = report["compared_at_tokens"]
            diffs = [compare.metric_by_tokens(runs[(v, s)], "val_loss")[at]
                     - compare.metric_by_tokens(runs[(baseline, s)], "val_loss")[at] for s in seeds]
            report["variants"][v].update(paired_seeds=list(seeds), differences=diffs)
    compare.add_evidence(report, dict(variants=variants), runs, schedule_end or {})
    return report


# ----------------------------------------------------------------------------- cost

def test_throughput_is_total_tokens_over_total_step_time_and_step_time_follows_from_it(tmp_path):
    """Unevenly loaded runs: one throughput per run (tokens / summed step time, not a median of
    windows), the median over the seeds whose timings are trusted (a flagged run left out, no ratio
    when half or more of a side's are flagged), and tokens/s x step time = tokens per step for every variant
    (the old report showed 1.35x tokens/s next to 0.59x step time for equal tokens per step)."""
    calm, loaded = [100.0] * 5, [100.0, 100.0, 300.0, 300.0, 300.0]
    runs = {("base", 1): fake_run(tmp_path / "b1", lambda t: 3.0, calm),
            ("base", 2): fake_run(tmp_path / "b2", lambda t: 3.0, loaded),
            ("base", 3): fake_run(tmp_path / "b3", lambda t: 3.0, [200.0] * 5),
            ("mix", 1): fake_run(tmp_path / "m1", lambda t: 2.9, [150.0] * 5, flops_per_token=1250),
            ("mix", 2): fake_run(tmp_path / "m2", lambda t: 2.9, [120.0] * 5, flops_per_token=1250),
            ("mix", 3): fake_run(tmp_path / "m3", lambda t: 2.9, [90.0] * 5, flops_per_token=1250)}
    report = compared(runs, {"base": [1, 2, 3], "mix": [1, 2, 3]})
    base, mix = report["variants"]["base"]["cost"], report["variants"]["mix"]["cost"]
    # base: 5000 tokens over 5 s, 11 s and 10 s
    # b2's windows after the first, 100, 300, 300, 300 ms: 90th percentile 300, 10th 160: not trusted, so
    # its 5000/11 tokens/s is left out: the baseline's throughput is the median of b1's and b3's
    assert base["unreliable"] == [dict(run="b2", spread=pytest.approx(300 / 160))] and mix["unreliable"] == []
    assert base["timed_runs"] == 2 and mix["timed_runs"] == 3
    assert base["tokens_per_sec"] == pytest.approx((1000 + 500) / 2)
    assert base["tokens_per_sec_range"] == pytest.approx([500, 1000])
    assert mix["tokens_per_sec"] == pytest.approx(5000 / 6)
    for c in (base, mix):
        assert c["tokens_per_sec"] * c["step_time_ms"] / 1000 == pytest.approx(100)  # tokens per step
    ratio = report["variants"]["mix"]["cost_ratio"]
    assert ratio["flops_per_token"] == pytest.approx(1.25) and ratio["parameters"] == 1
    assert ratio["tokens_per_sec"] == pytest.approx((5000 / 6) / 750)
    assert mix["tokens_per_sec_range"] == pytest.approx([5000 / 7.5, 5000 / 4.5], abs=0.5)
    assert base["runs"] == mix["runs"] == 3  # timed: 2 of 3, 3 of 3
    assert report["variants"]["base"]["cost_ratio"]["tokens_per_sec"] == 1
    # two of three baseline runs flagged: the ratio would rest on one run, so none is given as a number
    runs[("base", 1)] = fake_run(tmp_path / "b1", lambda t: 3.0, loaded)
    report = compared(runs, {"base": [1, 2, 3], "mix": [1, 2, 3]})
    ratio = report["variants"]["mix"]["cost_ratio"]
    assert "tokens_per_sec" not in ratio and "b2" in [u["run"] for u in ratio["tokens_per_sec_withheld"]]
    assert report["variants"]["base"]["cost"]["tokens_per_sec"] == pytest.approx(500)  # b3 alone
    assert report["variants"]["mix"]["cost"]["timed_runs"] == report["variants"]["mix"]["cost"]["runs"] == 3


def test_the_load_average_and_flops_per_token_are_recorded_by_a_run(data_dir, tmp_path):
    out = str(tmp_path / "run")
    train.main(tiny_args(data_dir, out, "--model_type=ra", "--ra_pattern=all", "--ra_mode=mix", "--max_iters=3",
                         "--lr_decay_iters=3"))
    run = rundir.read_run(out)
    loads = [run["info"]["start"]["load_average"]] + [e["load_average"] for e in run["events"]
                                                      if e["event"] in ("train", "end")]
    assert len(loads) == 5 and all(len(x) == 3 and min(x) >= 0 for x in loads)
    checklist = next(e for e in run["events"] if e["event"] == "checklist")
    L, C, T = 2, 32, 16
    assert checklist["flops_per_token"] == 6 * checklist["parameters"] + L * 18 * C * T
    run["status"] = "finished"
    cost = compare.cost([run])
    end = run["events"][-1]
    assert cost["tokens_per_sec"] == pytest.approx(end["tokens"] / end["train_time"])


def test_flops_per_token_of_mix_and_gate_against_a_hand_count():
    """Hand count for C = 32, T = 16, L = 2, V = 64: parameters per layer 12C^2 + 13C, plus the tied
    embedding and the final norm; attention per layer 6T x (score width + C): C for a plain layer, 2C
    for mix ([q, a k] . [k, q]), and two attentions for the learned gate (plus its one logit)."""
    C, T, L, V = 32, 16, 2, 64
    N = L * (12 * C * C + 13 * C) + V * C + 2 * C
    shape = dict(n_layer=L, n_head=2, n_embd=C, block_size=T, vocab_size=V)
    plain = RAGPT(RAConfig(**shape, ra_pattern="none"))
    mix = RAGPT(RAConfig(**shape, ra_pattern="all", ra_mode="mix", ra_alpha=0.5))
    gate = RAGPT(RAConfig(**shape, ra_pattern="learned"))
    assert plain.get_num_params() == mix.get_num_params() == N
    assert plain.flops_per_token() == 6 * N + L * 6 * T * (C + C)  # nanoGPT's 6N + 12LCT
    assert mix.flops_per_token() == 6 * N + L * 6 * T * (2 * C + C)
    n_gate = gate.get_num_params()
    assert n_gate - N == sum(p.numel() for n, p in gate.named_parameters() if "ra_" in n or "gate" in n)
    assert gate.flops_per_token() == 6 * n_gate + L * 2 * 6 * T * (C + C)


# ----------------------------------------------------------------------------- compute-matched view

def test_compute_matched_view_reads_each_seed_at_the_baselines_flops(tmp_path):
    """At the baseline's FLOPs (1000/token x 5000 tokens) the variant that costs 1250 per token has
    seen 4000 tokens: its schedule-end runs end there, and their final evaluation is read. At equal
    tokens it looks better by 0.05; at equal FLOPs it is 0.05 worse. Without schedule-end runs the
    view reads nothing, though the full runs evaluated at 4000 tokens (mid-schedule: another recipe)."""
    base = lambda s: (lambda t: 3.0 - t / 10000 + 0.01 * s)
    dear = lambda s: (lambda t: 2.95 - t / 10000 + 0.01 * s + 0.001 * s * (s - 2))
    ended = lambda s: (lambda t: dear(s)(t) - 0.02)  # a completed cosine ends lower than the same tokens mid-schedule
    runs, ends = {}, {}
    for s in (1, 2, 3):
        runs[("base", s)] = fake_run(tmp_path / f"b{s}", base(s), [100.0] * 5)
        runs[("dear", s)] = fake_run(tmp_path / f"d{s}", dear(s), [100.0] * 5, flops_per_token=1250)
        ends[("dear", s)] = fake_run(tmp_path / f"e{s}", ended(s), [100.0] * 4, flops_per_token=1250, iters=40)
    report = compared(runs, {"base": [1, 2, 3], "dear": [1, 2, 3]}, schedule_end=ends)
    m = report["variants"]["dear"]["compute_matched"]
    assert report["compared_at_tokens"] == 5000 and m["tokens"] == pytest.approx(4000) and m["read_from"] == "schedule_end"
    expected = [ended(s)(4000) - base(s)(5000) for s in (1, 2, 3)]
    assert m["differences"] == pytest.approx(expected) and m["diff_mean"] == pytest.approx(0.03 + 0.002 / 3)
    assert m["evaluated_at"] == {f"seed{s}": 4000 for s in (1, 2, 3)}
    assert m["flops"] == 5_000_000 and m["flops_ratio"] == 1.25
    assert report["variants"]["dear"]["differences"] == pytest.approx([-0.05 + 0.001 * s * (s - 2) for s in (1, 2, 3)])
    m = compared(runs, {"base": [1, 2, 3], "dear": [1, 2, 3]})["variants"]["dear"]["compute_matched"]
    assert m["read_from"] is None and m["differences"] == [] and m["verdict"] == "not evaluated"
    assert m["reasons"] == [dict(code="no_schedule_end_run")] and "equal_flops_runs" in render.why(m)
    # A cheaper variant's schedule-end runs train longer (6250 tokens); one that stopped at 5000 is named, not read.
    cheap, ends = {k: v for k, v in runs.items() if k[0] == "base"}, {}
    for s in (1, 2, 3):
        cheap[("cheap", s)] = fake_run(tmp_path / f"c{s}", base(s), [100.0] * 5, flops_per_token=800)
        ends[("cheap", s)] = fake_run(tmp_path / f"ce{s}", base(s), [100.0] * 5, flops_per_token=800,
                                      iters=125 if s < 3 else 100, tokens_per_iter=50, every=250)
    m = compared(cheap, {"base": [1, 2, 3], "cheap": [1, 2, 3]}, schedule_end=ends)["variants"]["cheap"]["compute_matched"]
    assert m["tokens"] == pytest.approx(6250) and m["differences"] == pytest.approx([base(s)(6250) - base(s)(5000)
                                                                                     for s in (1, 2)])
    assert m["verdict"] == "not evaluated" and m["missing"] == [dict(seed="seed3", closest=5000)]


def test_a_pair_the_main_table_cannot_compare_gets_no_equal_flops_verdict_either(tmp_path):
    """Every section judges the same comparability: the equal-FLOPs family of a confounded pair says
    'not comparable', as the main table does, instead of a verdict from the same runs."""
    base = lambda s: (lambda t: 3.0 - t / 10000 + 0.01 * s)
    dear = lambda s: (lambda t: 2.90 - t / 10000 + 0.01 * s + 0.001 * s)
    runs = {}
    for s in (1, 2, 3):
        runs[("base", s)] = fake_run(tmp_path / f"b{s}", base(s), [100.0] * 5)
        runs[("dear", s)] = fake_run(tmp_path / f"d{s}", dear(s), [100.0] * 5, flops_per_token=1250)
    report = dict(metric="val_loss", goal="lower", baseline="base", hellaswag_tokens=None, level=0.05, alpha=0.05,
                  min_effect=None, compared_at_tokens=5000, variants={"base": {}, "dear": dict(
                      verdict="not comparable", reasons=[dict(code="confounds", confounds={"n_head": [4, 2]})])})
    for run in runs.values():
        run["status"] = "finished"
    ends = {("dear", s): fake_run(tmp_path / f"e{s}", dear(s), [100.0] * 4, flops_per_token=1250, iters=40)
            for s in (1, 2, 3)}
    compare.add_evidence(report, dict(variants={"base": [1, 2, 3], "dear": [1, 2, 3]}), runs, ends)
    m = report["variants"]["dear"]["compute_matched"]
    assert len(m["differences"]) == 3 and m["verdict"] == "not comparable" and m["p_holm"] is None
    assert m["reasons"] == [dict(code="main_table", verdict="not comparable",
                                 reasons=[dict(code="confounds", confounds={"n_head": [4, 2]})])]


def forked(run, at_tokens, trunk_time, keep):
    """A fake run made a branch: a fork event at `at_tokens` (its trunk's train time), and of its
    evaluations only the fork's, `keep` and the end."""
    end = run["events"][-1]["tokens"]
    run["events"] = [e for e in run["events"] if e["event"] != "eval" or e["tokens"] in (at_tokens, *keep, end)]
    run["events"].insert(1, dict(event="fork", tokens=at_tokens, iter=at_tokens // 100, train_time=trunk_time,
                                 trunk=os.path.join(os.path.dirname(run["out_dir"]), "trunk-seed1")))
    run["events"][-1]["train_time"] += trunk_time
    return run


def test_forked_equal_flops_counts_the_trunk_at_the_baselines_rate_and_reads_only_a_runs_end(tmp_path):
    """Issue 40: forked at 2500 of 5000 tokens, a variant at 1.25x FLOPs per token reaches the
    baseline's budget at 2500 + 2500 / 1.25 = 4500 tokens (not 5000 / 1.25 = 4000). Issue 58: only a
    run that ends there is read (its final evaluation); a run evaluated at 4500 on its way to 5000 is
    not (mid-schedule), nor is one that ends 2.5% past the budget: the view names the seeds, no verdict."""
    base = lambda s: (lambda t: 3.0 - t / 10000 + 0.01 * s)
    bent = lambda s: (lambda t: base(s)(t) + (0.2 * np.exp(-(t - 2500) / 300) - 0.2 if t > 2500 else 0.0)
                      + 0.03 + 0.001 * s)
    runs = {}
    for s in (1, 2, 3):
        runs[("base", s)] = forked(fake_run(tmp_path / f"b{s}", base(s), [100.0] * 5), 2500, 30.0, ())
        runs[("dear", s)] = forked(fake_run(tmp_path / f"d{s}", bent(s), [100.0] * 5, flops_per_token=1250),
                                   2500, 30.0, (4500,))
    for iters, tokens in ((45, 4500), (50, None)):
        ends = {("dear", s): forked(fake_run(tmp_path / f"e{s}", bent(s), [100.0] * 5, flops_per_token=1250,
                                             iters=iters), 2500, 30.0, ()) for s in (1, 2, 3)}
        m = compared(runs, {"base": [1, 2, 3], "dear": [1, 2, 3]}, schedule_end=ends)["variants"]["dear"]["compute_matched"]
        assert m["tokens"] == pytest.approx(4500)
        if tokens:
            assert m["differences"] == pytest.approx([bent(s)(4500) - base(s)(5000) for s in (1, 2, 3)])
            assert m["verdict"] in ("better", "worse") and m["evaluated_at"] == {f"seed{s}": 4500 for s in (1, 2, 3)}
        else:  # the schedule ends at 5000 tokens, 2.5% more than the budget
            assert m["differences"] == [] and m["verdict"] == "not evaluated" and m["interval"] is None
            assert m["reasons"] == [dict(code="not_evaluated", tolerance=compare.MATCHED_TOLERANCE,
                                         missing=[dict(seed=f"seed{s}", closest=5000) for s in (1, 2, 3)])]
    m = compared(runs, {"base": [1, 2, 3], "dear": [1, 2, 3]})["variants"]["dear"]["compute_matched"]
    assert m["reasons"] == [dict(code="no_schedule_end_run")]  # the branches' evaluations at 4500 are not read


def test_a_branchs_cost_is_its_own_steps_and_time_beside_its_trunks(tmp_path):
    """Issue 40: a branch's log counts on from its trunk's tokens and train time; its throughput is
    what it did after the fork (2500 tokens in 5 s = 500/s), not a blend with the trunk's (5000 in
    35 s); the trunks' own cost stands beside it."""
    runs = {}
    for s in (1, 2, 3):
        runs[("base", s)] = forked(fake_run(tmp_path / f"b{s}", lambda t: 3.0, [100.0] * 5), 2500, 30.0, ())
        runs[("dear", s)] = forked(fake_run(tmp_path / f"d{s}", lambda t: 3.0, [120.0] * 5), 2500, 30.0, ())
    trunk = fake_run(tmp_path / "trunk-seed1", lambda t: 3.0, [90.0] * 5, iters=25)
    os.makedirs(trunk["out_dir"])
    with open(os.path.join(trunk["out_dir"], "log.jsonl"), "w") as f:
        f.writelines(json.dumps(e) + "\n" for e in trunk["events"])
    report = compared(runs, {"base": [1, 2, 3], "dear": [1, 2, 3]})
    own = report["variants"]["base"]["cost"]
    assert own["tokens_per_sec"] == pytest.approx(2500 / 5.0)
    assert report["variants"]["dear"]["cost_ratio"]["tokens_per_sec"] == pytest.approx(100 / 120)
    assert report["trunk_cost"]["tokens_per_sec"] == pytest.approx(2500 / 4.5)
    # a log from before the fork event carried train_time: the trunk's own end event says it
    for run in runs.values():
        run["events"][1].pop("train_time")
    assert compared(runs, {"base": [1, 2, 3], "dear": [1, 2, 3]})["variants"]["base"]["cost"]["tokens_per_sec"] \
        == pytest.approx(2500 / (5.0 + 30.0 - 4.5))


# ----------------------------------------------------------------------------- HellaSwag per item

def write_items(out_dir, right, tokens=200, extra=(), append=False):
    """hellaswag_items.jsonl with example i right (1) or wrong (0) as `right` says, at `tokens`."""
    os.makedirs(out_dir, exist_ok=True)
    items = [dict(example=f"ex{i}", label=0, loss_sum=[1, 2, 3, 4], loss_mean=[1, 2, 3, 4], correct=int(r),
                  correct_norm=int(r)) for i, r in enumerate(right)] + list(extra)
    evaluation.write_items(os.path.join(out_dir, rundir.HELLASWAG_ITEMS), items, append, iter=2, tokens=tokens)


def test_hellaswag_item_by_item_counts_the_same_items_over_seeds(tmp_path):
    rng = np.random.default_rng(0)
    n = 40
    base_right = {s: rng.integers(0, 2, n) for s in (1, 2)}
    var_right = {s: np.where(rng.random(n) < 0.3, 1 - base_right[s], base_right[s]) for s in (1, 2)}
    runs = {}
    for s in (1, 2):
        # an item the other side never saw is left out, not paired with nothing
        write_items(tmp_path / f"b{s}", base_right[s], extra=[dict(example="only-base", correct=1, correct_norm=1)])
        write_items(tmp_path / f"v{s}", var_right[s])
        write_items(tmp_path / f"v{s}", 1 - var_right[s], tokens=100, append=True)  # another evaluation: not this one
        runs[("base", s)] = dict(out_dir=str(tmp_path / f"b{s}"), status="finished")
        runs[("var", s)] = dict(out_dir=str(tmp_path / f"v{s}"), status="finished")
    result = compare.hellaswag_per_item({s: runs[("var", s)] for s in (1, 2)},
                                         {s: runs[("base", s)] for s in (1, 2)}, 200)
    assert result["items"] == n and result["seeds"] == [1, 2]
    assert result["diff"] == pytest.approx(np.mean([var_right[s].mean() - base_right[s].mean() for s in (1, 2)]))
    assert result["variant_only"] == sum(int(((var_right[s] == 1) & (base_right[s] == 0)).sum()) for s in (1, 2))
    assert result["baseline_only"] == sum(int(((var_right[s] == 0) & (base_right[s] == 1)).sum()) for s in (1, 2))
    # evidence only: no p over items x seeds, which would treat items of one model as independent
    same = compare.hellaswag_per_item({1: runs[("base", 1)]}, {1: runs[("base", 1)]}, 200)
    assert same["diff"] == 0 and same["variant_only"] == same["baseline_only"] == 0 and "p" not in same


def test_per_example_scores_agree_with_the_counts_and_the_losses(tmp_path):
    path = write_jsonl(tmp_path / "h.jsonl", FIXTURE)
    examples = evaluation.load_examples(path)
    model = tiny_gpt()
    result = evaluation.evaluate_hellaswag(model, examples, "cpu", batch_size=2, items=True)
    sums, means = evaluation.ending_losses(model, examples, "cpu")
    items = result["items"]
    assert [i["loss_sum"] for i in items] == sums.tolist() and [i["loss_mean"] for i in items] == means.tolist()
    assert sum(i["correct"] for i in items) == round(result["acc"] * 5)
    assert sum(i["correct_norm"] for i in items) == round(result["acc_norm"] * 5)
    assert len({i["example"] for i in items}) == 5
    assert {k: v for k, v in result.items() if k != "items"} == evaluation.evaluate_hellaswag(model, examples, "cpu")


def test_hellaswag_script_and_train_write_the_per_example_scores(data_dir, tmp_path):
    fixture = write_jsonl(tmp_path / "hellaswag_val.jsonl", FIXTURE)
    out = str(tmp_path / "run")
    train.main(tiny_args(data_dir, out, "--vocab_size=50304", "--max_iters=4", "--lr_decay_iters=4",
                         "--hellaswag_interval=4", f"--hellaswag_input={fixture}", "--hellaswag_limit=3"))
    with open(os.path.join(out, rundir.HELLASWAG_ITEMS)) as f:
        records = [json.loads(line) for line in f]
    assert [(r["iter"], r["tokens"]) for r in records] == [(0, 0)] * 3 + [(4, 4 * 128)] * 3
    logged = [e for e in rundir.read_events(out) if e["event"] == "hellaswag"]
    assert [sum(r["correct_norm"] for r in records if r["iter"] == e["iter"]) for e in logged] == \
           [round(e["acc_norm"] * 3) for e in logged]
    result = hellaswag.main([f"--out_dir={out}", f"--input={fixture}", "--device=cpu", "--dtype=float32",
                             f"--out_items={tmp_path}/items.jsonl"])
    with open(tmp_path / "items.jsonl") as f:
        written = [json.loads(line) for line in f]
    assert len(written) == 5 and sum(r["correct"] for r in written) == round(result["acc"] * 5)
    assert records[0]["example"] == written[0]["example"] == evaluation.example_digest(
        evaluation.load_examples(fixture)[0])


# ----------------------------------------------------------------------------- the written report

def test_report_shows_the_evidence_per_seed_the_cost_and_the_plots(tmp_path):
    runs = {}
    for s in (1, 2, 3):
        runs[("base", s)] = fake_run(tmp_path / f"b{s}", lambda t, s=s: 3.0 - t / 10000 + 0.01 * s, [100.0] * 5)
        runs[("mix", s)] = fake_run(tmp_path / f"m{s}", lambda t, s=s: 2.97 - t / 10000 + 0.01 * s - 0.001 * s,
                                    [120.0] * 5, flops_per_token=1250)
        for (v, _), run in runs.items():
            run["config"] = dict(seed=s, out_dir=run["out_dir"])
    suite = dict(name="toy", metric="val_loss", baseline="base", allowed=[], variants={"base": [1, 2, 3],
                                                                                        "mix": [1, 2, 3]})
    for (v, s), run in runs.items():
        run["config"] = dict(seed=s, out_dir=run["out_dir"])
    report = compare.compare(suite, runs)
    mix = report["variants"]["mix"]
    assert mix["signs"]["below"] == 3 and mix["signs"]["p"] == pytest.approx(0.25)
    path = render.write_report(report, runs, str(tmp_path / "report"))
    text = open(path).read()
    on_disk = json.load(open(tmp_path / "report" / "report.json"))["variants"]["mix"]
    assert on_disk["differences"] == pytest.approx([-0.031, -0.032, -0.033], abs=5e-4)  # the evidence per seed
    assert (on_disk["signs"]["below"], on_disk["signs"]["above"]) == (3, 0) and on_disk["signs"]["p"] == pytest.approx(0.25)
    assert on_disk["compute_matched"]["flops_ratio"] == pytest.approx(1.25)  # at equal model FLOPs
    assert round(on_disk["compute_matched"]["tokens"]) == 4000
    assert on_disk["cost"] and on_disk["cost_ratio"]["flops_per_token"] == pytest.approx(1.25)  # the cost
    for png in ("metric_vs_tokens.png", "paired_differences.png", "differences_over_tokens.png"):
        assert os.path.getsize(tmp_path / "report" / png) > 1000, png
        assert f"({png})" in text


# ----------------------------------------------------------------------------- edge cases and scale

def suite_of(runs):
    variants = {}
    for v, s in runs:
        variants.setdefault(v, []).append(s)
    for (v, s), run in runs.items():
        run["config"] = dict(seed=s, out_dir=run["out_dir"])
        run["info"] = dict(facts=dict(data_order="o", init_weights={}), code_versions=["x"])
    return dict(name="toy", metric="val_loss", baseline="base", allowed=[], variants=variants, min_effect=0.01)


def test_a_nan_metric_names_the_run_and_file_and_the_rest_of_the_report_is_built(tmp_path):
    """Issue 31: 'Out of range float values are not JSON compliant: nan', no run named, no report."""
    runs = {}
    for s in (1, 2, 3):
        runs[("base", s)] = fake_run(tmp_path / f"b{s}", lambda t, s=s: 3.0 - t / 10000 + 0.01 * s, [100.0] * 5)
        runs[("good", s)] = fake_run(tmp_path / f"g{s}", lambda t, s=s: 3.05 - t / 10000 + 0.011 * s, [100.0] * 5)
        runs[("bad", s)] = fake_run(tmp_path / f"x{s}", lambda t, s=s: (float("nan") if s == 2 and t > 3000 else
                                                                       2.9 - t / 10000 + 0.01 * s), [100.0] * 5)
    result = compare.compare(suite_of(runs), runs)
    assert result["non_finite"] == [dict(file=f"{tmp_path}/x2/log.jsonl", metric="val_loss", value="nan", tokens=5000)]
    bad, good = result["variants"]["bad"], result["variants"]["good"]
    assert bad["verdict"] == "incomplete" and bad["reasons"] == [dict(
        code="unfinished", unfinished=[], non_finite=[dict(variant=True, seed=2)], metric="val_loss")]
    assert bad["runs"]["seed2"]["value"] is None and bad["n"] == 2
    assert good["verdict"] == "worse" and good["p_holm"] is not None  # the rest is still judged
    path = render.write_report(result, runs, str(tmp_path / "report"))
    assert path.endswith("report.md")
    assert json.load(open(tmp_path / "report" / "report.json"))["non_finite"] == result["non_finite"]  # strict JSON


def test_a_negligible_difference_is_worded_as_such_in_the_table_and_the_plot(tmp_path):
    runs = {}
    for s in (1, 2, 3, 4, 5, 6):
        runs[("base", s)] = fake_run(tmp_path / f"b{s}", lambda t, s=s: 3.0 - t / 10000 + 0.01 * s, [100.0] * 5)
        runs[("tiny", s)] = fake_run(tmp_path / f"t{s}", lambda t, s=s: 3.0001 - t / 10000 + 0.01 * s
                                     + 2e-5 * (s % 3), [100.0] * 5)
    result = compare.compare(suite_of(runs), runs)
    tiny = result["variants"]["tiny"]
    assert tiny["verdict"] == "worse, but negligible" and tiny["interval"][0] > 0
    assert -0.01 < tiny["equivalence_interval"][0] and tiny["equivalence_interval"][1] < 0.01
    render.write_report(result, runs, str(tmp_path / "report"))
    assert [r["code"] for r in tiny["reasons"]][:2] == ["holm_rejects", "negligible"]
    on_disk = json.load(open(tmp_path / "report" / "report.json"))["variants"]
    assert on_disk["tiny"]["verdict"] == "worse, but negligible"  # never plain "worse"
    assert [r["code"] for r in on_disk["tiny"]["reasons"]][:2] == ["holm_rejects", "negligible"]
    assert "worse" not in {v.get("verdict") for v in on_disk.values()}


def test_hellaswag_is_judged_at_the_seed_level_with_holm(tmp_path):
    """Items of one seed share one model: the per-seed accuracy difference is the unit (a t-test over
    items pooled items x seeds as independent: 13-33% false positives at a nominal 5%)."""
    base_acc, var_acc = [0.30, 0.34, 0.31, 0.29], [0.33, 0.35, 0.35, 0.30]
    runs = {}
    for s in (1, 2, 3, 4):
        for v, accs in (("base", base_acc), ("var", var_acc), ("same", base_acc)):
            run = fake_run(tmp_path / f"{v}{s}", lambda t: 3.0, [100.0] * 5)
            run["events"].insert(-1, dict(event="hellaswag", tokens=5000, n=1000, acc=accs[s - 1], acc_norm=accs[s - 1]))
            runs[(v, s)] = run
    result = compare.compare(suite_of(runs), runs)
    paired = result["variants"]["var"]["hellaswag_paired"]
    diffs = np.subtract(var_acc, base_acc)
    assert paired["differences"] == pytest.approx(diffs) and paired["seeds"] == [1, 2, 3, 4]
    from scipy import stats as scipy_stats
    p = scipy_stats.ttest_1samp(diffs, 0.0).pvalue
    assert paired["p_value"] == pytest.approx(p) and paired["p_holm"] == pytest.approx(min(1, 2 * p))
    assert result["variants"]["same"]["hellaswag_paired"]["verdict"] == "deterministic"
    pooled = result["variants"]["var"]["hellaswag"]
    assert pooled["confidence"] == pytest.approx(1 - 0.05 / 2) and pooled["n"] == 4000
    assert len(paired["seeds"]) == 4 and paired["diff_mean"] == pytest.approx(0.0225)  # the seed as the unit


def test_the_equal_flops_view_is_holm_over_its_own_family_and_agrees_with_its_intervals(tmp_path):
    runs, ends = {}, {}
    for s in (1, 2, 3, 4):
        runs[("base", s)] = fake_run(tmp_path / f"b{s}", lambda t, s=s: 3.0 - t / 10000 + 0.01 * s, [100.0] * 5)
        for i, (name, shift) in enumerate((("a", 0.02), ("b", 0.0), ("c", 0.04))):
            runs[(name, s)] = fake_run(tmp_path / f"{name}{s}", lambda t, s=s, shift=shift: 3.0 + shift - t / 10000
                                       + 0.01 * s + 0.003 * (-1) ** s * (i + 1), [100.0] * 5, flops_per_token=1250)
            ends[(name, s)] = dict(runs[(name, s)], events=[e for e in runs[(name, s)]["events"]
                                                            if e.get("tokens", 0) <= 4000])  # its schedule ends at 4000
            ends[(name, s)]["events"].append(dict(event="end", tokens=4000, train_time=4.0))
    result = compare.compare(suite_of(runs), runs, ends)
    matched = {n: v["compute_matched"] for n, v in result["variants"].items() if v.get("compute_matched")}
    assert sorted(matched) == ["a", "b", "c"]  # every variant spends more FLOPs per token: none left out of the family
    raw = [m["p_value"] for m in matched.values()]
    assert [m["p_holm"] for m in matched.values()] == pytest.approx(stats.holm(raw, 0.05))
    for m in matched.values():
        low, high = m["interval"]
        assert (m["verdict"] in ("better", "worse")) == (low > 0 or high < 0), m
    assert "| p | p (Holm) |" in "\n".join(render.compute_matched_lines(result))


def test_a_24_seed_report_takes_seconds_and_little_memory(tmp_path):
    """report.py over 24 seeds of two variants took 135 s and about 23 GB (every 2^24 sign pattern in
    memory). Measured in a fresh process: the report alone, after the imports."""
    script = f"""
import resource, sys, time
sys.path.insert(0, {os.path.join(os.path.dirname(__file__))!r})
import numpy as np
from ablation import compare, render
import matplotlib.pyplot, scipy.stats  # the libraries' own import time is not the report's
from report_evidence_scale import fake_runs
runs, suite = fake_runs({str(tmp_path)!r}, 24)
before, start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.perf_counter()
render.write_report(compare.compare(suite, runs), runs, {str(tmp_path / 'report')!r})
print(time.perf_counter() - start, (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024)
"""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=os.path.dirname(
        os.path.dirname(os.path.abspath(__file__))), env=dict(os.environ, MPLBACKEND="Agg"))
    assert out.returncode == 0, out.stderr
    seconds, mib = map(float, out.stdout.split())
    assert seconds < 10 and mib < 500, (seconds, mib)
    result = json.load(open(tmp_path / "report" / "report.json"))
    assert result["variants"]["var"]["signs"]["resamples"] == stats.SIGN_FLIP_RESAMPLES
    assert result["variants"]["var"]["signs"]["monte_carlo_error"] is not None  # random patterns, not every one


def test_every_verdict_line_caption_and_plot_title_names_the_design(tmp_path, monkeypatch):
    """Issue 40: a forked suite answers another question than a from-scratch one; its design was on the
    report's second line only. Now the verdict table's caption, every 'why' line, the equal-FLOPs and
    cost captions and every plot title name it, with the margin's question."""
    runs = {}
    for s in (1, 2, 3):
        runs[("base", s)] = forked(fake_run(tmp_path / f"b{s}", lambda t, s=s: 3.0 - t / 10000 + 0.01 * s,
                                            [100.0] * 5), 2500, 30.0, ())
        runs[("dear", s)] = forked(fake_run(tmp_path / f"d{s}", lambda t, s=s: 3.02 - t / 10000 + 0.011 * s,
                                            [100.0] * 5, flops_per_token=1250), 2500, 30.0, (4500,))
    suite = suite_of(runs)
    report = compare.compare(suite, runs)
    titles = []
    import matplotlib.axes
    real = matplotlib.axes.Axes.set
    monkeypatch.setattr(matplotlib.axes.Axes, "set", lambda ax, **kw: titles.append(kw.get("title")) or real(ax, **kw))
    text = open(render.write_report(report, runs, str(tmp_path / "report"))).read()
    why = text.split("## Why each verdict")[1].split("\n## ")[0]
    lines = [line for line in why.splitlines() if line.startswith("- **")]
    assert len(lines) == 2 and all("(forked at step 25)" in line for line in lines), lines
    assert "Verdicts (forked at step 25):" in text and "## At equal model FLOPs (forked at step 25)" in text
    assert "## Cost (forked at step 25)" in text and "The margin is about the forked question" in text
    assert titles and all(t.endswith("forked at step 25") for t in filter(None, titles)), titles
