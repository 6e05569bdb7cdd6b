"""Does an idea help? Compare the runs of an ablation suite honestly.

A suite names its variants, seeds, baseline, the metric that decides (declared before any run)
and the config keys a variant may change. This module:
- refuses a comparison with an undeclared difference (a confound), from each run's resolved
  config and from what was measured (runrecord.py: data, evaluation windows, data order, initial
  weights, classes, dtype, device, versions);
- compares every variant at the largest token count that every finished run evaluated at;
- refuses a report whose runs do not measure the metric alike (data, evaluation windows, eval_iters);
- pairs seeds (same seed = same data order and initial shared weights, checked, not assumed),
  and judges the k paired differences as one planned family (stats.py: Holm, simultaneous
  intervals, TOST against ±min_effect, power): better, worse, equivalent, inconclusive,
  deterministic, too few seeds, not comparable, incomplete;
- writes report.md, report.json and PNG plots.

Used by sweep.py (the check before running, the report after) and report.py (the report rebuilt
from run directories alone).
"""
import json
import math
import os
import re

import numpy as np

import evaluation
import lm_eval_results
import rundir
import runrecord
import stats

# Keys every run of a suite sets differently without changing what is compared.
BOOKKEEPING = ("seed", "out_dir", "wandb_run_name", "wandb_group", "init_from", "allow_data_change")
# metric -> (log event, field, which direction is better)
METRICS = {"val_loss": ("eval", "val_loss", "lower"), "val_ppl": ("eval", "val_ppl", "lower"),
           "train_loss": ("eval", "train_loss", "lower"),
           "hellaswag_acc": ("hellaswag", "acc", "higher"), "hellaswag_acc_norm": ("hellaswag", "acc_norm", "higher")}
# A measured fact may differ only when a declared key explains it; facts with no key never may.
FACT_CAUSES = {
    "dataset_fingerprint": ("dataset", "data_dir"), "tokenizer": ("dataset", "data_dir"),
    "eval_windows": ("dataset", "data_dir", "eval_iters", "batch_size", "block_size"),
    "tokens_per_iter": ("batch_size", "block_size", "gradient_accumulation_steps", "tokens_per_iter"),
    "model_class": ("model_type",), "optimizer": ("optimizer",), "dtype": ("dtype",), "device_type": ("device",),
    "world_size": ("tp_size",), "torch_version": (), "code_versions": (), "intra_op_threads": (),
}
# What defines the metric itself: the same in every run of a report (variants and seeds), never "allowed".
MEASUREMENT_KEYS = ("dataset", "data_dir", "eval_iters")
MEASUREMENT_FACTS = ("dataset_fingerprint", "tokenizer", "eval_windows")
# The evaluation windows follow batch_size and block_size: a suite that varies those on purpose (an
# LR x batch grid) is told its windows differ instead of being refused.
WINDOW_SHAPE_KEYS = ("batch_size", "block_size")
PAIRED_FACTS = ("data_order", "init_weights")  # compared between runs of the same seed
DATA_ORDER_CAUSES = ("dataset", "data_dir", "batch_size", "block_size", "gradient_accumulation_steps",
                     "tokens_per_iter")
UNITS = {"val_loss": "nats per token", "train_loss": "nats per token", "val_ppl": "perplexity, exp(nats per token)",
         "hellaswag_acc": "fraction right", "hellaswag_acc_norm": "fraction right"}
CHANCE = {"hellaswag_acc": 0.25, "hellaswag_acc_norm": 0.25}
DEFAULT_ALPHA = 0.05


def check_metric(metric):
    if metric not in METRICS:
        raise ValueError(f"metric={metric!r}: use one of {tuple(METRICS)}")
    return METRICS[metric]


# ----------------------------------------------------------------------------- confounds

def config_differences(cfg, base, allowed):
    """{key: (value, baseline value)} for every undeclared difference between two resolved configs."""
    norm = lambda c, k: "scratch" if k == "init_from" and c.get(k) == "resume" else c.get(k)
    keys = (set(cfg) | set(base)) - set(BOOKKEEPING) - set(allowed)
    return {k: (cfg.get(k), base.get(k)) for k in sorted(keys) if norm(cfg, k) != norm(base, k)}


def measured_facts(run):
    info = run["info"] or {}
    return dict(info.get("facts") or {}, code_versions=info.get("code_versions"))


def fact_differences(run, base_run, allowed):
    """{fact: (value, baseline value)} for measured differences no declared key explains."""
    facts, base = measured_facts(run), measured_facts(base_run)
    diffs = {}
    for fact, causes in FACT_CAUSES.items():
        if fact in MEASUREMENT_FACTS:  # checked across every run by measurement_problems
            continue
        if facts.get(fact) != base.get(fact) and not set(causes) & set(allowed):
            diffs[fact] = (facts.get(fact), base.get(fact))
    return diffs


def pairing(run, base_run, allowed):
    """Whether two runs of one seed really are paired: the same data order, the same initial value
    of every weight both models have in the same shape. A list of what breaks the pairing."""
    facts, base = measured_facts(run), measured_facts(base_run)
    if not facts or not base:
        return ["no run_info.json: pairing cannot be checked"]
    problems = []
    if facts.get("data_order") != base.get("data_order") and not set(DATA_ORDER_CAUSES) & set(allowed):
        problems.append("different data order")
    ours, theirs = facts.get("init_weights", {}), base.get("init_weights", {})
    shared = [n for n in ours if n in theirs and ours[n][0] == theirs[n][0]]
    differ = [n for n in shared if ours[n][1] != theirs[n][1]]
    if differ:
        problems.append(f"{len(differ)} of {len(shared)} shared weight tensors start from other values "
                        f"(e.g. {differ[0]})")
    return problems


# ----------------------------------------------------------------------------- runs and the compared point

def metric_by_tokens(run, metric):
    event, field, _ = METRICS[metric]
    return {e["tokens"]: e[field] for e in run["events"] if e["event"] == event and field in e}


def common_tokens(runs, metric):
    """The largest token count at which every given run evaluated the metric (None if none)."""
    sets = [set(metric_by_tokens(r, metric)) for r in runs]
    shared = set.intersection(*sets) if sets else set()
    return max(shared) if shared else None


# ----------------------------------------------------------------------------- statistics

def binomial_interval(successes, trials):
    """Clopper-Pearson 95% interval of an accuracy (scipy)."""
    from scipy import stats
    ci = stats.binomtest(successes, trials).proportion_ci(0.95)
    return [float(ci.low), float(ci.high)]


def blocked_verdict(confounds, incomplete, n):
    """The verdict when no test may be read: undeclared differences, unfinished runs, no seed."""
    if confounds:
        return "not comparable", "undeclared differences: " + "; ".join(
            f"{k} = {a!r} vs baseline {b!r}" for k, (a, b) in confounds.items())
    if incomplete:
        return "incomplete", incomplete
    if n == 0:
        return "incomplete", "no paired seed finished"
    return None


# ----------------------------------------------------------------------------- the comparison

def compare(suite, runs):
    """The whole comparison as plain data (report.json).

    suite: dict(name, metric, baseline, allowed, variants: {variant: [seeds]}).
    runs: {(variant, seed): runrecord.read_run(...)} for every expected run.
    """
    metric, baseline = suite["metric"], suite["baseline"]
    _, _, goal = check_metric(metric)
    for run in runs.values():
        run["status"] = rundir.run_status(run["events"])
    finished = [r for r in runs.values() if r["status"] == "finished"]
    tokens = common_tokens(finished, metric)
    value = lambda run: metric_by_tokens(run, metric).get(tokens) if run["status"] == "finished" else None
    base_runs = {s: runs[(baseline, s)] for s in suite["variants"][baseline]}
    base_values = {s: value(r) for s, r in base_runs.items() if value(r) is not None}
    reference = next((r for r in base_runs.values() if r["config"] is not None), None)
    k = len(suite["variants"]) - 1
    alpha, min_effect = suite.get("alpha") or DEFAULT_ALPHA, suite.get("min_effect")
    report = dict(suite=suite["name"], metric=metric, goal=goal, baseline=baseline, compared_at_tokens=tokens,
                  alpha=alpha, min_effect=min_effect, comparisons=k, level=stats.family_level(alpha, k),
                  measurement=measurement_problems(runs, suite["allowed"]),
                  damaged=[note for run in runs.values() for note in run.get("damage", [])],
                  allowed=sorted(suite["allowed"]), allowed_declared=suite.get("allowed_declared", True),
                  heatmap=suite.get("heatmap") or [],
                  final_tokens={f"{v}-seed{s}": (r["events"][-1].get("tokens") if r["events"] else None)
                                for (v, s), r in runs.items()},
                  baseline_sd=float(np.std(list(base_values.values()), ddof=1)) if len(base_values) > 1 else None,
                  variants={})
    # HellaSwag runs at its own interval: its own largest common token count
    report["hellaswag_tokens"] = common_tokens(finished, "hellaswag_acc_norm")
    for variant, seeds in suite["variants"].items():
        own = {s: runs[(variant, s)] for s in seeds}
        values = {s: value(r) for s, r in own.items() if value(r) is not None}
        entry = dict(runs={f"seed{s}": dict(status=r["status"], value=value(r), out_dir=r["out_dir"])
                           for s, r in own.items()},
                     n=len(values), mean=float(np.mean(list(values.values()))) if values else None,
                     sd=float(np.std(list(values.values()), ddof=1)) if len(values) > 1 else None)
        hellaswag = hellaswag_summary(own.values(), report["hellaswag_tokens"])
        if hellaswag:
            entry["hellaswag"] = hellaswag
        tasks = lm_eval_results.pooled_task_scores([r["out_dir"] for r in own.values() if r["status"] == "finished"])
        if tasks:
            entry["lm_eval"] = tasks
        if variant != baseline:
            add_comparison(entry, report, suite, own, base_runs, base_values, values, reference)
        else:
            entry["verdict"], entry["why"] = "baseline", "the reference of every paired difference"
        report["variants"][variant] = entry
    decide(report)
    sd = pooled_difference_sd(report)
    if sd:
        seeds = max(len(s) for s in suite["variants"].values())
        report["plan"] = stats.plan_seeds(sd, seeds, k, alpha, min_effect)
    add_evidence(report, suite, runs)
    return report


def add_comparison(entry, report, suite, own, base_runs, base_values, values, reference):
    allowed = suite["allowed"]
    confounds, pairing_lines, missing = {}, [], []
    for seed, run in own.items():
        if run["config"] is None or reference is None:
            missing.append(run["out_dir"] + " (config.json)")
            continue
        paired = base_runs.get(seed, {}).get("config") is not None
        base_run = base_runs[seed] if paired else reference
        confounds.update(config_differences(run["config"], base_run["config"], allowed))
        if not run["info"] or not base_run["info"]:
            missing += [r["out_dir"] + " (run_info.json)" for r in (run, base_run) if not r["info"]]
            continue
        confounds.update(fact_differences(run, base_run, allowed))
        if paired:
            problems = pairing(run, base_run, allowed)
            pairing_lines.append(f"seed {seed}: " + ("; ".join(problems) if problems else "holds"))
        else:
            pairing_lines.append(f"seed {seed}: no baseline run of this seed")
    seeds = [s for s in values if s in base_values]
    diffs = [values[s] - base_values[s] for s in seeds]
    test = stats.paired_test(diffs, report["level"], report["min_effect"])
    broken = [f"{name} {r['status']}" for name, r in
              [(f"seed {s}", r) for s, r in own.items()] + [(f"baseline seed {s}", r) for s, r in base_runs.items()]
              if r["status"] != "finished"]
    incomplete = ", ".join(broken) + " (counted, not dropped)" if broken else ""
    if missing:  # a missing fact is never read as a difference, nor as agreement
        incomplete = "; ".join(filter(None, [incomplete, "missing or damaged: " + ", ".join(sorted(set(missing)))
                                             + ": the measured facts cannot be checked"]))
    entry.update(paired_seeds=seeds, differences=diffs, diff_mean=test["mean"], diff_sd=test["sd"],
                 interval=test["ci"], p_value=test["p"], tost_p=test["tost_p"], deterministic=test["deterministic"],
                 confounds={k: list(v) for k, v in confounds.items()}, pairing=pairing_lines,
                 blocked=blocked_verdict(confounds, incomplete, test["n"]))


def decide(report):
    """Holm over the family's raw p-values, then each comparison's verdict. A comparison without a
    test counts as p = 1, so the family keeps its planned size k."""
    compared = [(n, v) for n, v in report["variants"].items() if n != report["baseline"]]
    raw = [v["p_value"] if v["blocked"] is None and v["p_value"] is not None else 1.0 for _, v in compared]
    for (name, v), adjusted in zip(compared, stats.holm(raw, report["alpha"])):
        v["p_holm"] = adjusted if v["p_value"] is not None else None
        if report["measurement"] and not v["confounds"]:
            v["verdict"], v["why"] = "not comparable", "the metric is not measured alike in every run (see Measurement)"
        elif v["blocked"]:
            v["verdict"], v["why"] = v["blocked"]
        else:
            test = dict(n=len(v["differences"]), mean=v["diff_mean"], sd=v["diff_sd"], ci=v["interval"],
                        tost_p=v["tost_p"], deterministic=v["deterministic"])
            v["verdict"], v["why"] = stats.verdict(test, adjusted, report["alpha"], report["level"], report["goal"],
                                                   report["min_effect"])
        del v["blocked"]


def pooled_difference_sd(report):
    """The sd of paired differences pooled over the variants that have one (variances weighted by
    their degrees of freedom): what the seed planner needs."""
    parts = [(len(v["differences"]) - 1, v["diff_sd"]) for n, v in report["variants"].items()
             if n != report["baseline"] and v.get("diff_sd") and len(v.get("differences", [])) > 1]
    df = sum(d for d, _ in parts)
    return math.sqrt(sum(d * sd ** 2 for d, sd in parts) / df) if df else None


def seed_plan_text(suite, n_runs, pilot_dir):
    """sweep.py --plan: the planner's answer for this suite before anything runs, from a pilot (or
    this suite's own finished runs, when there are some)."""
    k, alpha, min_effect = len(suite["variants"]) - 1, suite["alpha"], suite["min_effect"]
    lines = [f"suite {suite['name']}: {len(suite['variants'])} variants x {len(suite['seeds'])} seeds = {n_runs} runs, "
             f"{k} comparison(s) against {suite['baseline']!r}, family-wise alpha {alpha:g}, min_effect "
             + (f"{min_effect:g}" if min_effect else "not declared (warning: equivalence cannot be shown)")]
    if not (pilot_dir and os.path.exists(os.path.join(pilot_dir, "suite.json"))):
        lines.append("no pilot: pass --pilot=SUITE_DIR (a finished suite) for the detectable effect and seeds needed")
        return "\n".join(lines)
    pilot, runs = load_suite_dir(pilot_dir)
    report = compare(dict(pilot, alpha=alpha, min_effect=min_effect), runs)
    sd = pooled_difference_sd(report)
    if not sd:
        lines.append(f"pilot {pilot_dir}: no variant has two paired seeds yet, so no sd to plan from")
        return "\n".join(lines)
    lines.append(f"from pilot {pilot_dir}:")
    lines.append(stats.describe_plan(stats.plan_seeds(sd, len(suite["seeds"]), k, alpha, min_effect)))
    times = [e["train_time"] for r in runs.values() for e in r["events"][-1:] if e.get("event") == "end"
             and e.get("train_time")]
    if times:
        lines.append(f"training time per run in the pilot: median {np.median(times):.0f} s -> about "
                     f"{n_runs * np.median(times) / 60:.0f} min of training for {n_runs} runs one at a time "
                     f"(evaluation and start-up come on top)")
    return "\n".join(lines)


def measurement_problems(runs, allowed):
    """What makes the metric differ between any two runs of the report (variants and seeds alike):
    each line names the runs and both values. Runs without the record are left to `incomplete`."""
    problems = []
    recorded = [r for r in runs.values() if r["config"] is not None]
    if not recorded:
        return problems
    ref = recorded[0]
    name = lambda r: os.path.basename(os.path.normpath(r["out_dir"]))
    for run in recorded:
        for start in (run["info"] or {}).get("resumes", []):
            if start.get("data_changed"):
                problems.append(f"{', '.join(start['data_changed'])}: {name(run)} resumed on changed data "
                                f"(allow_data_change)")
    for run in recorded[1:]:
        for key in MEASUREMENT_KEYS:
            if run["config"].get(key) != ref["config"].get(key):
                problems.append(f"{key}: {name(run)} has {run['config'].get(key)!r}, {name(ref)} {ref['config'].get(key)!r}")
        if not (run["info"] and ref["info"]):
            continue
        facts, ref_facts = measured_facts(run), measured_facts(ref)
        for fact in MEASUREMENT_FACTS:
            if fact == "eval_windows" and set(WINDOW_SHAPE_KEYS) & set(allowed):
                continue
            if facts.get(fact) != ref_facts.get(fact):
                problems.append(f"{fact}: {name(run)} has {facts.get(fact)!r}, {name(ref)} {ref_facts.get(fact)!r}")
    return list(dict.fromkeys(problems))


def hellaswag_summary(runs, tokens):
    """Pooled HellaSwag accuracy of a variant's finished runs at `tokens`, with a Clopper-Pearson
    interval and whether chance (0.25) lies inside it."""
    right, total = {"acc": 0, "acc_norm": 0}, 0
    for run in runs:
        at = [e for e in run["events"] if e["event"] == "hellaswag" and e["tokens"] == tokens]
        if run.get("status") == "finished" and at:
            total += at[-1]["n"]
            for key in right:
                right[key] += round(at[-1][key] * at[-1]["n"])
    if not total:
        return None
    out = {"n": total}
    for key, k in right.items():
        ci = binomial_interval(k, total)
        out[key] = dict(value=k / total, ci95=ci, chance_inside=ci[0] <= 0.25 <= ci[1])
    return out


# ----------------------------------------------------------------------------- evidence, cost, HellaSwag per item

TIMING_SPREAD_LIMIT = 1.5  # a run whose logged step times spread wider (90th / 10th percentile) has no trusted timing


def sign_flip_test(diffs):
    """Signs of the paired differences and the exact two-sided sign-flip p-value: under "no effect"
    each difference is as likely negative as positive, so all 2^n sign patterns are enumerated
    (scipy's permutation test; n = 3 cannot go below 0.25). Assumes symmetry, not normality."""
    from scipy import stats
    d = np.asarray(diffs, dtype=np.float64)
    out = dict(below=int((d < 0).sum()), above=int((d > 0).sum()), zero=int((d == 0).sum()), p=None)
    if len(d) >= 2:
        test = stats.permutation_test((d,), np.mean, permutation_type="samples", n_resamples=np.inf,
                                      alternative="two-sided", vectorized=True, axis=-1)
        out["p"] = min(1.0, float(test.pvalue))
    return out


def run_cost(run):
    """A finished run's cost: one throughput, its tokens over its summed training-step time (a step
    time is then tokens per step over it, never a separate median); how widely its logged step
    times spread (the first window, with compilation and allocation, aside); the highest 1-minute
    load average recorded; peak memory; parameters and model FLOPs per token from its checklist."""
    end = next((e for e in reversed(run["events"]) if e["event"] == "end"), None)
    if end is None or not end.get("train_time") or not end.get("tokens"):
        return None
    checklist = next((e for e in run["events"] if e["event"] == "checklist"), {})
    steps = [e for e in run["events"] if e["event"] == "train"]
    windows = [e["step_time_ms"] for e in steps[1:]]
    loads = [e["load_average"][0] for e in [((run["info"] or {}).get("start") or {}), *steps, end]
             if e.get("load_average")]
    memory = [e["peak_memory_mib"] for e in steps if e.get("peak_memory_mib") is not None]
    return dict(name=os.path.basename(os.path.normpath(run["out_dir"])), tokens=end["tokens"],
                train_time=end["train_time"], tokens_per_sec=end["tokens"] / end["train_time"],
                step_time_spread=float(np.percentile(windows, 90) / np.percentile(windows, 10))
                if len(windows) >= 2 else None,
                max_load=max(loads, default=None), peak_memory_mib=max(memory, default=None),
                parameters=checklist.get("parameters"), flops_per_token=checklist.get("flops_per_token"),
                tokens_per_iter=checklist.get("tokens_per_iter"))


def cost(runs):
    """A variant's cost over its finished runs: the median throughput and its range over seeds, the
    step time that follows from it, peak memory, parameters, FLOPs per token, and which runs' timings
    are not to be trusted (step times spread beyond TIMING_SPREAD_LIMIT)."""
    rows = [c for c in (run_cost(r) for r in runs if r["status"] == "finished") if c]
    if not rows:
        return None
    speed = [r["tokens_per_sec"] for r in rows]
    one = lambda key: next((r[key] for r in rows if r[key] is not None), None)
    out = dict(runs=len(rows), tokens_per_sec=float(np.median(speed)), tokens_per_sec_range=[min(speed), max(speed)],
               parameters=one("parameters"), flops_per_token=one("flops_per_token"),
               tokens_per_iter=one("tokens_per_iter"), max_load=max((r["max_load"] for r in rows
                                                                    if r["max_load"] is not None), default=None),
               peak_memory_mib=float(np.median(m)) if (m := [r["peak_memory_mib"] for r in rows
                                                              if r["peak_memory_mib"] is not None]) else None,
               unreliable=[f"{r['name']} (step times spread x{r['step_time_spread']:.2f})" for r in rows
                           if r["step_time_spread"] is not None and r["step_time_spread"] > TIMING_SPREAD_LIMIT])
    out["step_time_ms"] = 1000 * out["tokens_per_iter"] / out["tokens_per_sec"] if out["tokens_per_iter"] else None
    return out


def metric_at(run, metric, tokens):
    """The metric interpolated linearly between a run's evaluations at `tokens` (None outside them)."""
    curve = metric_by_tokens(run, metric)
    xs = sorted(curve)
    if tokens is None or not xs or not xs[0] <= tokens <= xs[-1]:
        return None
    return float(np.interp(tokens, xs, [curve[x] for x in xs]))


def compute_matched(report, runs, variant, seeds, base_seeds):
    """The variant's metric at the baseline's model FLOPs at the compared point (the baseline's FLOPs
    per token x compared tokens), interpolated on each seed's evaluation curve, paired with the
    baseline seed: an idea that costs more per token is not flattered by an equal-token comparison."""
    base_cost, own_cost = report["variants"][report["baseline"]].get("cost"), report["variants"][variant].get("cost")
    tokens = report["compared_at_tokens"]
    if not (base_cost and own_cost and base_cost["flops_per_token"] and own_cost["flops_per_token"] and tokens):
        return None
    flops = base_cost["flops_per_token"] * tokens
    at = flops / own_cost["flops_per_token"]
    values, diffs = {}, []
    for seed in seeds:
        run, base = runs[(variant, seed)], runs.get((report["baseline"], seed))
        if seed in base_seeds and run["status"] == base["status"] == "finished":
            values[seed] = metric_at(run, report["metric"], at)
            if values[seed] is not None:
                diffs.append(values[seed] - metric_at(base, report["metric"], tokens))
    test = stats.paired_test(diffs, report["level"])
    return dict(flops=flops, tokens=at, flops_ratio=own_cost["flops_per_token"] / base_cost["flops_per_token"],
                values={f"seed{s}": v for s, v in values.items()}, differences=diffs, diff_mean=test["mean"],
                interval=test["ci"], p_value=test["p"],
                missing=[f"seed{s}" for s, v in values.items() if v is None])


def hellaswag_items(run, tokens):
    """{example digest: record} of a run's per-example HellaSwag scores at `tokens` (train.py's
    hellaswag_items.jsonl); a torn line is skipped."""
    path = os.path.join(run["out_dir"], evaluation.HELLASWAG_ITEMS)
    items = {}
    if tokens is None or not os.path.exists(path):
        return items
    with open(path) as f:
        for line in f:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if record.get("tokens") == tokens:
                items[record["example"]] = record
    return items


def hellaswag_per_item(own, base_runs, tokens, key="correct_norm"):
    """Variant against baseline on the same HellaSwag items: per item, the difference in right (1)
    or wrong (0) averaged over the paired seeds; their mean is the accuracy difference, with a
    Student-t 95% interval and p over items (items, not item x seed pairs, are the independent
    units). Counts of items only one side got right, summed over seeds, show where it comes from."""
    from scipy import stats
    pairs = []
    for seed, run in own.items():
        base = base_runs.get(seed)
        if base is not None and run["status"] == base["status"] == "finished":
            mine, theirs = hellaswag_items(run, tokens), hellaswag_items(base, tokens)
            if mine and theirs:
                pairs.append((seed, mine, theirs))
    common = sorted(set.intersection(*(set(m) & set(t) for _, m, t in pairs))) if pairs else []
    if not common:
        return None
    d = np.array([[m[i][key] - t[i][key] for i in common] for _, m, t in pairs], dtype=np.float64)
    per_item = d.mean(axis=0)
    out = dict(metric=key, items=len(common), seeds=[s for s, _, _ in pairs], diff=float(per_item.mean()),
               variant_only=int((d > 0).sum()), baseline_only=int((d < 0).sum()), ci95=None, p=None)
    if per_item.std() == 0:  # the same answer on every item: no spread to test against
        out.update(ci95=[out["diff"], out["diff"]], p=1.0 if out["diff"] == 0 else None)
    else:
        test = stats.ttest_1samp(per_item, 0.0)
        ci = test.confidence_interval(0.95)
        out.update(ci95=[float(ci.low), float(ci.high)], p=float(test.pvalue))
    return out


def add_evidence(report, suite, runs):
    """What the comparison rests on, per variant: cost and its ratios to the baseline, the per-seed
    differences with their signs and exact sign-flip p, the compute-matched view and HellaSwag per item."""
    baseline = report["baseline"]
    by_variant = {v: {s: runs[(v, s)] for s in seeds} for v, seeds in suite["variants"].items()}
    for variant, entry in report["variants"].items():
        entry["cost"] = cost(by_variant[variant].values())
    base_cost = report["variants"][baseline]["cost"]
    for variant, entry in report["variants"].items():
        if entry["cost"] and base_cost:
            entry["cost_ratio"] = {k: entry["cost"][k] / base_cost[k] for k in
                                   ("tokens_per_sec", "parameters", "flops_per_token", "peak_memory_mib")
                                   if entry["cost"][k] and base_cost[k]}
        if variant == baseline:
            continue
        entry["signs"] = sign_flip_test(entry.get("differences") or [])
        entry["compute_matched"] = compute_matched(report, runs, variant, suite["variants"][variant],
                                                   suite["variants"][baseline])
        per_item = hellaswag_per_item(by_variant[variant], by_variant[baseline], report["hellaswag_tokens"])
        if per_item:
            entry["hellaswag_per_item"] = per_item


# ----------------------------------------------------------------------------- the report

def fmt(value, digits=4):
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def write_report(report, runs, out_dir):
    """report.json, the PNG plots and report.md (which embeds them) in out_dir."""
    os.makedirs(out_dir, exist_ok=True)
    plots = make_plots(report, runs, out_dir)
    with open(os.path.join(out_dir, "report.json"), "w") as f:
        json.dump(report, f, indent=1, allow_nan=False, default=str)
    with open(os.path.join(out_dir, "report.md"), "w") as f:
        f.write(markdown(report, plots))
    return os.path.join(out_dir, "report.md")


def markdown(report, plots):
    metric, tokens = report["metric"], report["compared_at_tokens"]
    better = "lower" if report["goal"] == "lower" else "higher"
    lines = [f"# Ablation report: {report['suite']}", "",
             f"Deciding metric (declared before the runs): **{metric}** ({better} is better), compared at "
             f"**{fmt(tokens)} tokens**, the largest token count at which every finished run was evaluated "
             f"(final token counts: {fmt(min(filter(None, report['final_tokens'].values()), default=None))} to "
             f"{fmt(max(filter(None, report['final_tokens'].values()), default=None))}).",
             f"Paired differences are variant minus baseline (`{report['baseline']}`) on the same seed. "
             f"**{report['comparisons']} comparison(s), Holm** at family-wise alpha {report['alpha']:g}: p-values "
             f"are Holm-adjusted and each interval is a simultaneous {100 * (1 - report['level']):.4g}% "
             f"(Bonferroni) Student-t interval. Smallest effect of interest (min_effect): "
             + (f"**±{report['min_effect']:g}** {UNITS.get(metric, '')}." if report["min_effect"] else
                "**not declared** (warning: equivalence cannot be shown; declare min_effect in the suite or "
                "pass --min_effect to report.py).")
             + f" Keys allowed to differ: {', '.join(report['allowed']) or 'none'}"
             + ("." if report["allowed_declared"] else " (no suite declared them: every config difference "
                                                       "between these runs is treated as intended)."), "",
             f"| variant | verdict | seeds | mean | sd | diff vs baseline | {100 * (1 - report['level']):.4g}% "
             f"simultaneous interval | p | p (Holm) |", "|" + "---|" * 9]
    for name, v in report["variants"].items():
        ci = v.get("interval")
        lines.append(" | ".join([
            f"| {name}", f"**{v['verdict']}**", str(v["n"]), fmt(v["mean"]), fmt(v["sd"]),
            fmt(v.get("diff_mean")) if name != report["baseline"] else "-",
            f"[{ci[0]:+.4g}, {ci[1]:+.4g}]" if ci else "-", fmt(v.get("p_value"), 3),
            fmt(v.get("p_holm"), 3)]) + " |")
    if report.get("declared_after_the_runs"):
        lines.append(f"\nNote: {', '.join(report['declared_after_the_runs'])} declared after the runs (report.py), "
                     f"not before them.")
    lines.append(f"\nBaseline seed-to-seed sd: {fmt(report['baseline_sd'])} (a property of single runs; each "
                 f"paired difference is judged against its own standard error).")
    if report["measurement"]:
        lines += ["", "## Measurement (must agree in every run): NOT COMPARABLE", ""] + [
            f"- {m}" for m in report["measurement"]]
    if report["damaged"]:
        lines += ["", "## Damaged files (and what was done about them)", ""] + [f"- {d}" for d in report["damaged"]]
    if report.get("plan"):
        lines += ["", "## Seed plan", "", "```", stats.describe_plan(report["plan"]), "```"]
    lines += ["", "## Why each verdict", ""]
    lines += [f"- **{name}**: {v['verdict']}: {v['why']}." for name, v in report["variants"].items()]
    pairing = [f"- {name}: {'; '.join(v['pairing'])}" for name, v in report["variants"].items() if "pairing" in v]
    if pairing:
        lines += ["", "## Pairing (same seed = same data order and initial shared weights)", "", *pairing]
    lines += evidence_lines(report) + compute_matched_lines(report) + cost_lines(report) + hellaswag_lines(report)
    lines += lm_eval_results.report_lines(report)
    lines += ["", "## Runs", "", "| variant | seed | status | value at compared point | final tokens | out_dir |",
              "|---|---|---|---|---|---|"]
    for name, v in report["variants"].items():
        for seed, r in v["runs"].items():
            lines.append(f"| {name} | {seed.removeprefix('seed')} | {r['status']} | {fmt(r['value'])} | "
                         f"{fmt(report['final_tokens'].get(f'{name}-{seed}'))} | {r['out_dir']} |")
    if plots:
        lines += ["", "## Plots", ""] + [f"![{title}]({file})" for title, file in plots]
    return "\n".join(lines) + "\n"


def thousands(count):
    return "-" if count is None else f"{count:,}"


def signed(value, digits=4):
    return "-" if value is None else f"{value:+.{digits}g}"


def evidence_lines(report):
    """Per seed: the paired differences, their signs and the exact sign-flip p next to the t-test's."""
    compared = [(n, v) for n, v in report["variants"].items() if v.get("signs")]
    if not compared:
        return []
    seeds = sorted({s for _, v in compared for s in v["paired_seeds"]})
    lines = ["", "## The evidence per seed", "",
             f"Each paired difference (variant - baseline, same seed); the signs (below / above 0) and the exact "
             f"sign-flip p (all 2^n sign patterns; n = 3 cannot go below 0.25) need no normality, the t-test's p does.",
             "", "| variant | " + " | ".join(f"seed {s}" for s in seeds) + " | below / above 0 | sign-flip p | t-test p |",
             "|" + "---|" * (len(seeds) + 4)]
    for name, v in compared:
        by_seed = dict(zip(v["paired_seeds"], v["differences"]))
        signs = v["signs"]
        lines.append(f"| {name} | " + " | ".join(signed(by_seed.get(s)) for s in seeds) +
                     f" | {signs['below']} / {signs['above']} | {fmt(signs['p'], 3)} | {fmt(v.get('p_value'), 3)} |")
    return lines


def compute_matched_lines(report):
    matched = [(n, v["compute_matched"]) for n, v in report["variants"].items() if v.get("compute_matched")]
    if not matched:
        return []
    lines = ["", f"## At equal model FLOPs", "",
             f"The baseline's model FLOPs at the compared point ({matched[0][1]['flops']:.4g}): each variant's "
             f"{report['metric']} at the token count where it spent as much (linear between its evaluations; "
             f"'-' where it never got there), paired with the baseline seed, Student-t at the family's simultaneous level.", "",
             "| variant | FLOPs/token x | tokens at equal FLOPs | diff vs baseline | interval | p |",
             "|---|---|---|---|---|---|"]
    for name, m in matched:
        ci = m["interval"]
        lines.append(f"| {name} | {m['flops_ratio']:.3f} | {m['tokens']:,.0f} | {signed(m['diff_mean'])} | "
                     + (f"[{ci[0]:+.4g}, {ci[1]:+.4g}]" if ci else "-") + f" | {fmt(m['p_value'], 3)} |")
    return lines


def cost_lines(report):
    costs = [(n, v["cost"], v.get("cost_ratio", {})) for n, v in report["variants"].items() if v.get("cost")]
    if not costs:
        return []
    lines = ["", "## Cost", "",
             "Throughput per run = its tokens / its summed training-step time; the median over seeds [min, max], "
             "and the step time that follows from it. FLOPs per token count every matmul with weights (6N) and "
             "the attention as it runs (RA's mix doubles the score width; a learned gate runs two attentions).",
             "", "| variant | tokens/s [range] | x baseline | step time ms | parameters | x | FLOPs/token | x | "
             "peak mem MiB | highest load |", "|" + "---|" * 10]
    for name, c, ratio in costs:
        low, high = c["tokens_per_sec_range"]
        lines.append(f"| {name} | {c['tokens_per_sec']:,.0f} [{low:,.0f}, {high:,.0f}] | "
                     f"{fmt(ratio.get('tokens_per_sec'), 3)} | {fmt(c['step_time_ms'], 4)} | {thousands(c['parameters'])} | "
                     f"{fmt(ratio.get('parameters'), 4)} | {thousands(c['flops_per_token'])} | "
                     f"{fmt(ratio.get('flops_per_token'), 4)} | {fmt(c['peak_memory_mib'], 4)} | {fmt(c['max_load'], 3)} |")
    unreliable = [r for _, c, _ in costs for r in c["unreliable"]]
    if unreliable:
        lines += ["", f"**Timings not to be trusted** (logged step times spread more than x{TIMING_SPREAD_LIMIT} "
                      f"between the 10th and 90th percentile, e.g. other work on the machine): " + ", ".join(unreliable)
                  + ". Compare FLOPs per token instead, or time on an idle machine (bench_step.py)."]
    return lines


def hellaswag_lines(report):
    lines = []
    pooled = [(n, v["hellaswag"]) for n, v in report["variants"].items() if "hellaswag" in v]
    if pooled:
        lines += ["", f"## HellaSwag at {fmt(report['hellaswag_tokens'])} tokens, the largest count every finished "
                  f"run evaluated it at (pooled over seeds, Clopper-Pearson 95%)", "",
                  "| variant | n | acc_norm | interval | chance (0.25) inside |", "|---|---|---|---|---|"]
        lines += [f"| {n} | {h['n']} | {h['acc_norm']['value']:.4f} | [{h['acc_norm']['ci95'][0]:.4f}, "
                  f"{h['acc_norm']['ci95'][1]:.4f}] | {'yes' if h['acc_norm']['chance_inside'] else 'no'} |"
                  for n, h in pooled]
    per_item = [(n, v["hellaswag_per_item"]) for n, v in report["variants"].items() if v.get("hellaswag_per_item")]
    if per_item:
        lines += ["", "HellaSwag item by item against the baseline (acc_norm; the same items, paired over items and "
                      "seeds: per item the right/wrong difference averaged over seeds, Student-t 95% over items):", "",
                  "| variant | items | seeds | acc_norm diff | 95% interval | p | only variant right | "
                  "only baseline right |", "|---|---|---|---|---|---|---|---|"]
        lines += [f"| {n} | {h['items']} | {len(h['seeds'])} | {h['diff']:+.4f} | "
                  + (f"[{h['ci95'][0]:+.4f}, {h['ci95'][1]:+.4f}]" if h["ci95"] else "-")
                  + f" | {fmt(h['p'], 3)} | {h['variant_only']} | {h['baseline_only']} |" for n, h in per_item]
    return lines


def make_plots(report, runs, out_dir):
    """[(title, file)] of the PNGs written: loss against tokens with the seeds' band, the paired
    differences (forest plot), and where the runs have them: syncs per forward against loss,
    sparsity against perplexity, a heatmap over two swept numeric keys."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plots = []

    def save(fig, file, title):
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, file), dpi=110)
        plt.close(fig)
        plots.append((title, file))

    metric, variants = report["metric"], report["variants"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    later = []  # values after the first evaluation: the initial loss would flatten everything else
    for name in variants:
        curves = [metric_by_tokens(r, metric) for (v, _), r in runs.items() if v == name and r["status"] == "finished"]
        if not curves:
            continue
        xs = sorted(set.intersection(*(set(c) for c in curves)))
        ys = np.array([[c[x] for x in xs] for c in curves])
        ax.plot(xs, ys.mean(axis=0), label=f"{name} ({len(curves)} seeds)")
        ax.fill_between(xs, ys.min(axis=0), ys.max(axis=0), alpha=0.2)
        later += ys[:, 1:].ravel().tolist()
    if later:
        pad = 0.05 * (max(later) - min(later) or 1.0)
        ax.set_ylim(min(later) - pad, max(later) + pad)
    if report["compared_at_tokens"]:
        ax.axvline(report["compared_at_tokens"], color="gray", linestyle=":", label="compared here")
    ax.set(xlabel="tokens", ylabel=f"{metric} ({UNITS[metric]})", title=f"{metric} (mean, band = min..max over seeds)")
    ax.legend(fontsize=8)
    save(fig, "metric_vs_tokens.png", f"{metric} against tokens")

    compared = [(n, v) for n, v in variants.items() if v.get("diff_mean") is not None]
    if compared:
        save(*forest_plot(report, compared, plt), "paired differences (forest plot)")
        save(*differences_over_tokens(report, runs, [n for n, _ in compared], plt),
             "paired differences over tokens, one line per seed")

    final_eval = lambda r: next((e for e in reversed(r["events"]) if e["event"] == "eval"), None)
    points = [(name, final_eval(r)) for (name, _), r in runs.items() if r["status"] == "finished"]
    for field, file, xlabel, ylabel, title in (
            ("syncs_forward", "syncs_vs_loss.png", "all-reduces per forward", "val_loss", "syncs against loss"),
            ("sparsity", "sparsity_vs_ppl.png", "sparsity", "val_ppl", "sparsity against perplexity")):
        have = [(n, e) for n, e in points if e and field in e]
        if have:
            fig, ax = plt.subplots(figsize=(6, 4))
            for name in dict(have):
                xs = [e[field] for n, e in have if n == name]
                ax.plot(xs, [e[ylabel] for n, e in have if n == name], "o", label=name)
            ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
            ax.legend(fontsize=7)
            save(fig, file, title)

    heat = heatmap_axes(report, runs)
    if heat:
        (kx, xs), (ky, ys), grid = heat
        fig, ax = plt.subplots(figsize=(6, 4.5))
        image = ax.imshow(grid, origin="lower", cmap="viridis_r" if report["goal"] == "lower" else "viridis")
        ax.set_xticks(range(len(xs)), [fmt(x, 3) for x in xs])
        ax.set_yticks(range(len(ys)), [fmt(y, 3) for y in ys])
        for (i, j), value in np.ndenumerate(grid):
            if not math.isnan(value):
                ax.text(j, i, f"{value:.3f}", ha="center", va="center", color="white", fontsize=7)
        fig.colorbar(image, label=f"{metric} (mean over seeds)")
        ax.set(xlabel=kx, ylabel=ky, title=f"{metric} over {kx} x {ky}")
        save(fig, "heatmap.png", f"{metric} over {kx} x {ky}")
    return plots


def forest_plot(report, compared, plt):
    """Each variant's mean paired difference and interval, with the numbers, the ±min_effect band
    (when the report has one) and which side is better."""
    fig, ax = plt.subplots(figsize=(7.5, 0.6 * len(compared) + 1.8))
    for i, (name, v) in enumerate(compared):
        ax.plot([v["diff_mean"]], [i], "o", color="black")
        ci = v.get("interval")
        if ci:
            ax.plot(ci, [i, i], "-", color="black")
        ax.annotate(f"{v['diff_mean']:+.4f}" + (f" [{ci[0]:+.4f}, {ci[1]:+.4f}]" if ci else ""), (v["diff_mean"], i),
                    textcoords="offset points", xytext=(0, 7), ha="center", fontsize=7)
    ax.axvline(0, color="gray", linestyle=":")
    if report.get("min_effect"):
        ax.axvspan(-report["min_effect"], report["min_effect"], color="tab:blue", alpha=0.12,
                   label=f"±min_effect {report['min_effect']:g}")
        ax.legend(fontsize=8, loc="lower right")
    ax.set_yticks(range(len(compared)), [f"{n}: {v['verdict']}" for n, v in compared])
    ax.set_ylim(-0.7, len(compared) - 0.3)
    left, right = ("better", "worse") if report["goal"] == "lower" else ("worse", "better")
    ax.set(xlabel=f"{report['metric']}: variant - baseline (same seed), {100 * (1 - report['level']):.4g}% "
                  f"simultaneous interval\n{left} <-   |   -> {right}",
           title="paired differences")
    return fig, "paired_differences.png"


def differences_over_tokens(report, runs, names, plt):
    """Per variant, variant - baseline at every evaluation both runs of a seed share, one line per seed:
    whether a difference is steady or only where the comparison happens to be made."""
    fig, axes = plt.subplots(1, len(names), figsize=(3.2 * len(names) + 1, 3.4), sharey=True, squeeze=False)
    for ax, name in zip(axes[0], names):
        for (variant, seed), run in sorted(runs.items(), key=lambda item: str(item[0])):
            base = runs.get((report["baseline"], seed))
            if variant != name or base is None or run["status"] != "finished" or base["status"] != "finished":
                continue
            mine, theirs = metric_by_tokens(run, report["metric"]), metric_by_tokens(base, report["metric"])
            xs = sorted(set(mine) & set(theirs))[1:]  # from the first evaluation after the start
            ax.plot(xs, [mine[x] - theirs[x] for x in xs], marker=".", label=f"seed {seed}")
        ax.axhline(0, color="gray", linestyle=":")
        if report.get("min_effect"):
            ax.axhspan(-report["min_effect"], report["min_effect"], color="tab:blue", alpha=0.12)
        if report["compared_at_tokens"]:
            ax.axvline(report["compared_at_tokens"], color="gray", linestyle="--", linewidth=0.8)
        ax.set(title=name, xlabel="tokens")
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel(f"{report['metric']} - baseline ({UNITS[report['metric']]})")
    return fig, "differences_over_tokens.png"


def heatmap_axes(report, runs):
    """Over the suite's `heatmap` keys, or else when the variants differ in exactly two numeric keys
    (e.g. learning rate x batch size): ((key, values), (key, values), grid of the variants' means)."""
    configs = {}
    for (name, _), r in runs.items():
        if r["config"] is not None:
            configs.setdefault(name, r["config"])
    keys = [k for k in report["allowed"]
            if len({json.dumps(c.get(k)) for c in configs.values()}) > 1
            and all(isinstance(c.get(k), (int, float)) and not isinstance(c.get(k), bool) for c in configs.values())]
    keys = report["heatmap"] or keys
    if len(keys) != 2 or len(configs) < 4:
        return None
    kx, ky = keys
    xs = sorted({c[kx] for c in configs.values()})
    ys = sorted({c[ky] for c in configs.values()})
    grid = np.full((len(ys), len(xs)), np.nan)
    for name, c in configs.items():
        mean = report["variants"][name]["mean"]
        if mean is not None:
            grid[ys.index(c[ky]), xs.index(c[kx])] = mean
    return (kx, xs), (ky, ys), grid


# ----------------------------------------------------------------------------- where runs come from

def read_suite_json(path):
    """A suite's frozen declaration; a damaged file is named in one line, never parsed half-way."""
    try:
        with open(path, encoding="utf-8") as f:
            declared = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is damaged ({e}): it holds the plan declared before the runs; restore it "
                         f"(or delete it to declare the suite again from its file)") from None
    if not isinstance(declared, dict) or not {"metric", "baseline", "runs"} <= set(declared):
        raise ValueError(f"{path} is not a suite declaration (no metric, baseline and runs)")
    return declared


def load_suite_dir(suite_dir):
    """(suite, runs) of a directory written by sweep.py: suite.json names each run's variant and seed."""
    declared = read_suite_json(os.path.join(suite_dir, "suite.json"))
    suite = {k: declared.get(k) for k in ("name", "metric", "baseline", "allowed", "heatmap", "alpha", "min_effect")}
    suite["variants"], runs = {}, {}
    for run_name, (variant, seed) in declared["runs"].items():
        suite["variants"].setdefault(variant, []).append(seed)
        runs[(variant, seed)] = runrecord.read_run(os.path.join(suite_dir, run_name))
    return suite, runs


def suite_from_run_dirs(dirs, metric, baseline="", allowed=None, alpha=DEFAULT_ALPHA, min_effect=None):
    """(suite, runs) for run directories that no suite produced: runs whose configs agree but for
    bookkeeping keys (seed, out_dir, ...) are one variant, named after their directories; the
    baseline is `baseline` (a variant or a directory) or the first directory's variant. Without
    `allowed`, every config difference counts as intended (the report says so)."""
    check_metric(metric)
    groups = {}
    for d in dirs:
        run = runrecord.read_run(d)
        if run["config"] is None:
            damaged = [line for line in run["damage"] if line.startswith(os.path.join(d, "config.json"))]
            raise ValueError(f"{damaged[0] if damaged else d + ' has no config.json'}: without its config the run "
                             f"cannot be placed: restore config.json, or leave {d} out")
        key = json.dumps({k: v for k, v in run["config"].items() if k not in BOOKKEEPING}, sort_keys=True)
        groups.setdefault(key, []).append(run)
    variants, runs = {}, {}
    for group in groups.values():
        stems = {re.sub(r"-seed\d+$", "", os.path.basename(os.path.normpath(r["out_dir"]))) for r in group}
        name = stems.pop() if len(stems) == 1 else os.path.basename(os.path.normpath(group[0]["out_dir"]))
        for run in group:
            seed = run["config"]["seed"]
            if (name, seed) in runs:
                raise ValueError(f"{runs[(name, seed)]['out_dir']} and {run['out_dir']} are the same variant with "
                                 f"the same seed: give one of them")
            runs[(name, seed)] = run
            variants.setdefault(name, []).append(seed)
    by_dir = {os.path.normpath(r["out_dir"]): v for (v, _), r in runs.items()}
    base = by_dir.get(os.path.normpath(baseline), baseline) or by_dir[os.path.normpath(dirs[0])]
    if base not in variants:
        raise ValueError(f"baseline={baseline!r} is neither a given directory nor one of the variants {list(variants)}")
    declared = allowed is not None
    if not declared:
        ref = next(r for (v, _), r in runs.items() if v == base)["config"]
        allowed = sorted({k for r in runs.values() for k in config_differences(r["config"], ref, ())})
    suite = dict(name="runs " + ", ".join(variants), metric=metric, baseline=base, allowed=list(allowed),
                 variants=variants, allowed_declared=declared, alpha=alpha, min_effect=min_effect)
    return suite, runs


def report_suite_dir(suite_dir, out_dir=None, plan=None):
    """The suite's report; `plan` (alpha, min_effect) may fill in only what the suite did not declare
    before its runs, and the report then says it was declared afterwards."""
    suite, runs = load_suite_dir(suite_dir)
    late = {k: v for k, v in (plan or {}).items() if suite.get(k) is None}
    refused = sorted(set(plan or {}) - set(late))
    if refused:
        raise ValueError(f"{suite_dir} declared {', '.join(f'{k}={suite[k]!r}' for k in refused)} before its runs: "
                         f"it cannot be changed here")
    report = compare(dict(suite, **late), runs)
    if late:
        report["declared_after_the_runs"] = sorted(late)
    return write_report(report, runs, out_dir or suite_dir)
