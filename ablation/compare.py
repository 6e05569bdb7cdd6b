"""Does an idea help? Compare the runs of an ablation suite honestly.

A suite names its variants, seeds, baseline, the metric that decides (declared before any run)
and the config keys a variant may change. This module:
- refuses a comparison with an undeclared difference (a confound), from each run's resolved
  config and from what was measured (runrecord.py: data, evaluation windows, data order, initial
  weights, classes, dtype, device, versions);
- compares every variant at the largest token count that every finished run evaluated at;
- refuses a report whose runs do not measure the metric alike (data, evaluation windows, eval_iters);
- pairs seeds (same seed = same data order and initial shared weights, checked, not assumed),
  and judges the k paired differences as one planned family (ablation/stats.py: Holm with intervals at
  each step's level, TOST against ±min_effect, the seed plan): better, worse, "better/worse, but
  negligible", equivalent, inconclusive, deterministic, too few seeds, not comparable, incomplete
  (a run whose metric is not finite is named and its comparison is incomplete);
- keeps the suite's sequential record (runs added after a look, every look) and tests each look at
  the alpha its declared plan spends there, or says that the verdict is not at nominal alpha.
The result is plain data (report.json); ablation/render.py words and draws it.

Used by sweep.py (the check before running) and, through ablation/render.py, by sweep.py and
report.py (the report).
"""
import json
import math
import os

import numpy as np

import rundir
from ablation import lm_eval_results, stats

# Keys every run of a suite sets differently without changing what is compared.
# fork_from names each seed's own trunk: whether a pair shares one is the pairing's check (initial weights)
# eval_at adds evaluations and changes nothing that is trained
BOOKKEEPING = ("seed", "out_dir", "wandb_run_name", "wandb_group", "init_from", "allow_data_change", "fork_from",
               "eval_at")
# metric -> (log event, field, which direction is better)
METRICS = {"val_loss": ("eval", "val_loss", "lower"), "val_ppl": ("eval", "val_ppl", "lower"),
           "train_loss": ("eval", "train_loss", "lower"),
           "hellaswag_acc": ("hellaswag", "acc", "higher"), "hellaswag_acc_norm": ("hellaswag", "acc_norm", "higher")}
# A measured fact may differ only when a declared key explains it; facts with no key never may.
FACT_CAUSES = {
    "dataset_fingerprint": ("dataset", "data_dir"), "tokenizer": ("dataset", "data_dir"),
    "eval_windows": ("dataset", "data_dir", "eval_iters", "final_eval_iters", "batch_size", "block_size"),
    "tokens_per_iter": ("batch_size", "block_size", "gradient_accumulation_steps", "tokens_per_iter"),
    "model_class": ("model_type",), "optimizer": ("optimizer",), "dtype": ("dtype",), "device_type": ("device",),
    "world_size": ("tp_size",), "torch_version": (), "code_versions": (), "intra_op_threads": (),
}
# What defines the metric itself: the same in every run of a report (variants and seeds), never "allowed".
MEASUREMENT_KEYS = ("dataset", "data_dir", "eval_iters", "final_eval_iters")
MEASUREMENT_FACTS = ("dataset_fingerprint", "tokenizer", "eval_windows")
# The evaluation windows follow batch_size and block_size: a suite that varies those on purpose (an
# LR x batch grid) is told its windows differ instead of being refused.
WINDOW_SHAPE_KEYS = ("batch_size", "block_size")
PAIRED_FACTS = ("data_order", "init_weights")  # compared between runs of the same seed
DATA_ORDER_CAUSES = ("dataset", "data_dir", "batch_size", "block_size", "gradient_accumulation_steps",
                     "tokens_per_iter", "data_order", "data_seed")  # data_order allowed: a true null on batch order
UNITS = {"val_loss": "nats per token", "train_loss": "nats per token", "val_ppl": "perplexity, exp(nats per token)",
         "hellaswag_acc": "fraction right", "hellaswag_acc_norm": "fraction right"}
CHANCE = {"hellaswag_acc": 0.25, "hellaswag_acc_norm": 0.25}
DEFAULT_ALPHA = 0.05


def check_metric(metric):
    """(log event, field, goal) of a metric; suites.check_metric names the choices for a wrong one."""
    return METRICS[metric]


# ----------------------------------------------------------------------------- confounds

def config_differences(cfg, base, allowed):
    """{key: (value, baseline value)} for every undeclared difference between two resolved configs."""
    norm = lambda c, k: "scratch" if k == "init_from" and c.get(k) == "resume" else c.get(k)
    keys = (set(cfg) | set(base)) - set(BOOKKEEPING) - set(allowed)
    return {k: (cfg.get(k), base.get(k)) for k in sorted(keys) if norm(cfg, k) != norm(base, k)}


def code_version_seeds(runs):
    """{code version: the seeds whose runs trained at it}: a pair at two versions is a confound (fact_differences);
    seeds at different versions are pooled, and the report says which ran where."""
    seeds = {}
    for (_, seed), run in runs.items():
        for version in (run["info"] or {}).get("code_versions") or []:
            seeds.setdefault(version, set()).add(seed)
    return {version: sorted(s, key=str) for version, s in sorted(seeds.items())}


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
    of every weight both models have in the same shape. A list of what breaks the pairing, each a
    dict with its `code` (no_run_info, data_order, init_weights) and its numbers."""
    if not (run["info"] or {}).get("facts") or not (base_run["info"] or {}).get("facts"):
        return [dict(code="no_run_info")]  # (measured_facts always holds code_versions, even without a record)
    facts, base = measured_facts(run), measured_facts(base_run)
    problems = []
    if facts.get("data_order") != base.get("data_order") and not set(DATA_ORDER_CAUSES) & set(allowed):
        problems.append(dict(code="data_order"))
    ours, theirs = facts.get("init_weights", {}), base.get("init_weights", {})
    shared = [n for n in ours if n in theirs and ours[n][0] == theirs[n][0]]
    differ = [n for n in shared if ours[n][1] != theirs[n][1]]
    if differ:
        problems.append(dict(code="init_weights", differ=len(differ), shared=len(shared), example=differ[0]))
    return problems


# ----------------------------------------------------------------------------- runs and the compared point

def relative_dirs(runs):
    """{(variant, seed): the run's directory relative to the runs' common parent (a suite's directory)}: a
    committed report names no directory of the machine that ran it."""
    full = {key: os.path.abspath(run["out_dir"]) for key, run in runs.items()}
    parent = os.path.commonpath(list(full.values())) if full else ""
    if parent in full.values():  # a single run: its own directory is the common path
        parent = os.path.dirname(parent)
    return {key: os.path.relpath(path, parent) for key, path in full.items()}


def metric_by_tokens(run, metric):
    event, field, _ = METRICS[metric]
    return {e["tokens"]: e[field] for e in run["events"] if e["event"] == event and field in e}


def common_tokens(runs, metric):
    """The largest token count at which every given run evaluated the metric (None if none)."""
    sets = [set(metric_by_tokens(r, metric)) for r in runs]
    shared = set.intersection(*sets) if sets else set()
    return max(shared) if shared else None


# ----------------------------------------------------------------------------- statistics

def binomial_interval(successes, trials, confidence=0.95):
    """Clopper-Pearson interval of an accuracy (scipy)."""
    from scipy import stats
    ci = stats.binomtest(successes, trials).proportion_ci(confidence)
    return [float(ci.low), float(ci.high)]


def blocked_verdict(confounds, incomplete, n):
    """(verdict, reasons) when no test may be read: undeclared differences, unfinished runs or missing
    records (incomplete: their reasons), no seed; None when a test may be read."""
    if confounds:
        return "not comparable", [dict(code="confounds", confounds={k: list(v) for k, v in confounds.items()})]
    if incomplete:
        return "incomplete", incomplete
    if n == 0:
        return "incomplete", [dict(code="no_paired_seed")]
    return None


# ----------------------------------------------------------------------------- the sequential record


def looks_taken(record):
    """The distinct seed counts at which a report was built (a second report at the same count sees
    the same data, so it is no new look)."""
    return sorted({e["seeds"] for e in record if e.get("event") == "look"})


def obrien_fleming_spent(fraction, alpha):
    """Alpha spent by the information fraction t (Lan-DeMets, O'Brien-Fleming type):
    2 - 2 Phi(z_(1 - alpha/2) / sqrt(t)): little early, almost all of it at the last look."""
    from scipy import stats
    return float(2 * stats.norm.sf(stats.norm.isf(alpha / 2) / math.sqrt(fraction)))


def spent_per_look(looks, alpha):
    """The alpha each planned look tests at: the O'Brien-Fleming-type spending's increments (they sum to alpha)."""
    spent = [obrien_fleming_spent(n / looks[-1], alpha) for n in looks]
    return [b - a for a, b in zip([0.0, *spent], spent)]


def sequential_alpha(suite, seeds):
    """(family-wise alpha for a report at `seeds` paired seeds, the look as data: its `code` and the
    numbers that say why). A suite that declared `looks` (seed counts) tests each planned look at the
    alpha spent there (code planned_look); a look beyond the plan (off_plan), or several looks without
    one (unplanned_looks), keeps the nominal alpha and is not at it; one_look otherwise. `added`: the
    runs added after a look, and after how many."""
    alpha, record = suite.get("alpha") or DEFAULT_ALPHA, suite.get("record") or []
    looks = sorted(set(looks_taken(record)) | {seeds})
    planned = suite.get("looks")
    added = [e for e in record if e.get("event") == "added" and e.get("looks_before")]
    out = dict(seeds=seeds, looks=looks, planned=planned, alpha=alpha,
               added=dict(runs=sorted(added[0]["runs"]), looks_before=added[0]["looks_before"]) if added else None)
    if planned:
        if suite.get("stop_decided") and not seeds:  # no declared look reached yet: no test is read
            return alpha, dict(out, code="before_first_look")
        if set(looks) <= set(planned):
            j = planned.index(seeds)
            spent = spent_per_look(planned, alpha)[j]
            return spent, dict(out, code="planned_look", number=j + 1, spent=spent)
        return alpha, dict(out, code="off_plan")
    if len(looks) > 1:
        return alpha, dict(out, code="unplanned_looks")
    return alpha, dict(out, code="one_look")


# ----------------------------------------------------------------------------- the comparison

def finite_value(run, metric, tokens, problems):
    """A finished run's metric at `tokens`; a value that is not finite is None and is named (its log
    file, the value as text: JSON has no NaN) in problems."""
    if run["status"] != "finished":
        return None
    logged = metric_by_tokens(run, metric)
    value = logged.get(tokens)
    if tokens in logged and (value is None or not math.isfinite(value)):  # null: how a NaN reaches a JSON log
        problems.append(dict(file=os.path.join(run["out_dir"], "log.jsonl"), metric=metric,
                             value="null" if value is None else str(value), tokens=tokens))
        return None
    return value


def compare(suite, runs, schedule_end=None):
    """The whole comparison as plain data (report.json).

    suite: dict(name, metric, baseline, allowed, variants: {variant: [seeds]}, alpha, min_effect, and
    for a suite directory its record and declared looks).
    runs: {(variant, seed): rundir.read_run(...)} for every expected run.
    schedule_end: {(variant, seed): run} of the runs whose schedule ends at the baseline's FLOPs (the
    equal-FLOPs view; none: that view says so).
    """
    metric, baseline = suite["metric"], suite["baseline"]
    _, _, goal = check_metric(metric)
    for run in runs.values():
        run["status"] = rundir.run_status(run["events"])
        if run.get("not_started"):  # a branch whose trunk diverged: named, not merely "not run"
            run["status"] += f" ({run['not_started']})"
    finished = [r for r in runs.values() if r["status"] == "finished"]
    tokens = common_tokens(finished, metric)
    non_finite = []
    values = {key: finite_value(r, metric, tokens, non_finite) for key, r in runs.items()}
    base_runs = {s: runs[(baseline, s)] for s in suite["variants"][baseline]}
    base_values = {s: values[(baseline, s)] for s in base_runs if values[(baseline, s)] is not None}
    reference = next((r for r in base_runs.values() if r["config"] is not None), None)
    k = len(suite["variants"]) - 1
    report = dict(suite=suite["name"], metric=metric, goal=goal, baseline=baseline, compared_at_tokens=tokens,
                  design_code=design(runs), fork_at=min({fork_point(r) for r in runs.values()} - {None}, default=None),
                  alpha=suite.get("alpha") or DEFAULT_ALPHA, min_effect=suite.get("min_effect"), comparisons=k,
                  measurement_problems=measurement_problems(runs, suite["allowed"]), non_finite=non_finite,
                  damaged=[note for run in runs.values() for note in run.get("damage", [])],
                  allowed=sorted(suite["allowed"]), allowed_declared=suite.get("allowed_declared", True),
                  heatmap=suite.get("heatmap") or [], declared_seeds=suite.get("declared_seeds"),
                  final_tokens={f"{v}-seed{s}": (r["events"][-1].get("tokens") if r["events"] else None)
                                for (v, s), r in runs.items()},
                  baseline_sd=float(np.std(list(base_values.values()), ddof=1)) if len(base_values) > 1 else None,
                  about=about(reference, tokens), tuning=suite.get("tuning"), earlier_recipes=suite.get("earlier") or [],
                  code_versions=code_version_seeds(runs), variants={})
    # HellaSwag runs at its own interval: its own largest common token count
    report["hellaswag_tokens"] = common_tokens(finished, "hellaswag_acc_norm")
    where = relative_dirs(runs)
    for variant, seeds in suite["variants"].items():
        own = {s: runs[(variant, s)] for s in seeds}
        mine = {s: values[(variant, s)] for s in seeds if values[(variant, s)] is not None}
        entry = dict(runs={f"seed{s}": dict(status=r["status"], value=values[(variant, s)], out_dir=where[(variant, s)])
                           for s, r in own.items()},
                     n=len(mine), mean=float(np.mean(list(mine.values()))) if mine else None,
                     sd=float(np.std(list(mine.values()), ddof=1)) if len(mine) > 1 else None,
                     learning_rate=one_value(r["config"].get("learning_rate") for r in own.values() if r["config"]))
        tasks = lm_eval_results.pooled_task_scores([r["out_dir"] for r in own.values() if r["status"] == "finished"])
        if tasks:
            entry["lm_eval"] = tasks
        if variant != baseline:
            add_comparison(entry, report, suite, variant, own, base_runs, base_values, mine, reference)
        else:
            entry["verdict"], entry["reasons"] = "baseline", [dict(code="baseline")]
        report["variants"][variant] = entry
    seeds = max((len(v["differences"]) for n, v in report["variants"].items() if n != baseline), default=0)
    if suite.get("stop_decided"):  # its tests are read at the declared looks only: between them, the last one reached
        seeds = max((n for n in suite["looks"] if n <= seeds), default=0)
    report["looked_at_seeds"] = seeds
    report["alpha"], report["look"] = sequential_alpha(suite, seeds)
    report["level"] = stats.family_level(report["alpha"], k)
    report["analysis"] = suite.get("analysis") or "paired"  # a suite declared before the key: the paired analysis
    if suite.get("stop_decided"):  # the sequential blocked analysis; the runs it stopped are no missing runs
        report.update(stop_decided_at=suite["looks"], stopped=suite.get("stopped") or {},
                      stop_half_width=suite.get("stop_half_width"),
                      half_width_narrowed=[e for e in suite.get("record") or [] if e.get("event") == "stop_half_width"])
    planned_seeds = max(len(s) for s in suite["variants"].values())
    if report["analysis"] == "blocked":
        names, seeds_used, table = blocked_table(report)
        report["blocked_analysis"] = dict(variants=names, seeds=seeds_used, arm_sds=arm_sds(table))
        plan = stats.plan_blocked(report["blocked_analysis"]["arm_sds"], names, len(seeds_used), planned_seeds,
                                  report["alpha"], report["min_effect"]) if names and len(seeds_used) >= 2 else None
    else:
        plan = stats.plan_variants(difference_sds(report), planned_seeds, k, report["alpha"], report["min_effect"])
    if plan:
        report["plan"] = plan
    decide(report)
    add_hellaswag(report, suite, runs)
    add_evidence(report, suite, runs, schedule_end or {})
    return report


def add_comparison(entry, report, suite, variant, own, base_runs, base_values, values, reference):
    allowed = suite["allowed"]
    confounds, pairing_checks, missing = {}, [], []
    for seed, run in own.items():
        if run["config"] is None or reference is None:
            if run["status"] != "not run":  # a run not yet made is counted as such (unfinished), not as damage
                missing.append(run["out_dir"] + " (config.json)")
            continue
        paired = base_runs.get(seed, {}).get("config") is not None
        base_run = base_runs[seed] if paired else reference
        confounds.update(config_differences(run["config"], base_run["config"], allowed))
        if not run["info"] or not base_run["info"]:
            missing += [r["out_dir"] + " (run_info.json)" for r in (run, base_run) if not r["info"]]
            continue
        confounds.update(fact_differences(run, base_run, allowed))
        pairing_checks.append(dict(seed=seed, paired=paired,
                                   problems=pairing(run, base_run, allowed) if paired else []))
    seeds = [s for s in values if s in base_values]
    diffs = [values[s] - base_values[s] for s in seeds]
    scale = float(np.mean(np.abs(list(base_values.values())))) if base_values else None
    test = stats.paired_test(diffs, scale)
    stopped = variant in (suite.get("stopped") or {})  # judged at its look: the baseline's later seeds are not its
    both = [(dict(variant=True, seed=s), r) for s, r in own.items()] + \
        [(dict(variant=False, seed=s), r) for s, r in base_runs.items() if s in own or not stopped]
    unfinished = [dict(who, status=r["status"]) for who, r in both if r["status"] != "finished"]
    non_finite = [who for who, r in both if r["status"] == "finished" and any(
        p["file"] == os.path.join(r["out_dir"], "log.jsonl") for p in report["non_finite"])]
    incomplete = [dict(code="unfinished", unfinished=unfinished, non_finite=non_finite, metric=report["metric"])
                  ] if unfinished or non_finite else []
    if missing:  # a missing fact is never read as a difference, nor as agreement
        incomplete.append(dict(code="records_missing", records=sorted(set(missing))))
    entry.update(paired_seeds=seeds, differences=diffs, diff_mean=test["mean"], diff_sd=test["sd"],
                 p_value=test["p"], deterministic=test["deterministic"], test=test,
                 confounds={k: list(v) for k, v in confounds.items()}, pairing=pairing_checks,
                 blocked=blocked_verdict(confounds, incomplete, test["n"]))


def untestable(report, v):
    return v["blocked"] is not None or bool(report["measurement_problems"] and not v["confounds"])


def replayable(report, v):
    """Whether the sequential replay may read an arm: testable, or held back only by runs not finished yet (the
    looks it takes end before their seeds, so what was seen at the looks already taken shows)."""
    if not untestable(report, v):
        return True
    if report["measurement_problems"] and not v["confounds"]:
        return False
    verdict, reasons = v["blocked"]
    return verdict == "incomplete" and all(r["code"] == "unfinished" and not r["non_finite"] for r in reasons)


def blocked_table(report):
    """(variants, seeds, table) of the blocked analysis: the baseline's row first, then every variant that can
    be tested (no confound, no unfinished run, the metric measured alike), over the seeds complete across all
    of them (declared: the whole table's complete seeds, so every contrast rests on the same blocks; a seed
    missing in one tested arm leaves the table)."""
    base = report["variants"][report["baseline"]]
    names = [n for n, v in report["variants"].items() if n != report["baseline"] and not untestable(report, v)]
    rows = [base["runs"]] + [report["variants"][n]["runs"] for n in names]
    seeds = [s for s in base["runs"] if all((row.get(s) or {}).get("value") is not None for row in rows)]
    table = np.array([[row[s]["value"] for s in seeds] for row in rows], dtype=np.float64).reshape(len(rows), len(seeds))
    return names, [int(s.removeprefix("seed")) for s in seeds], table


def arm_sds(table):
    """Each arm's own sd (baseline first) in the blocked table: Shukla's block-adjusted estimate with three or
    more arms; with two, the arms cannot be told apart and the contrast's sd over sqrt(2) stands for each."""
    if table.shape[1] < 2 or len(table) < 2:  # no seed spread, or no testable variant
        return []
    if len(table) >= 3:
        return [float(x) for x in np.sqrt(stats.arm_variances(table))]
    return [float(np.std(table[1] - table[0], ddof=1) / math.sqrt(2))] * len(table)


def sequential_table(report):
    """(variants, table) of a suite that stops decided arms: the baseline's seeds in run order (ascending,
    sweep.family_order), each replayable variant's value or NaN where it has none (stopped, or not yet run)."""
    base = report["variants"][report["baseline"]]
    names = [n for n, v in report["variants"].items() if n != report["baseline"] and replayable(report, v)]
    seeds = sorted((s for s in base["runs"] if base["runs"][s]["value"] is not None), key=lambda s: int(s[4:]))
    row = lambda runs: [(runs.get(s) or {}).get("value") for s in seeds]
    table = np.array([row(base["runs"]), *(row(report["variants"][n]["runs"]) for n in names)], dtype=np.float64)
    return names, table.reshape(len(names) + 1, len(seeds))


def decide_sequential(report, looks):
    """The sequential blocked analysis (stats.judge_sequential) at the declared looks: each variant's verdict at
    its last look's level; the looks taken, with the arms each tested and stopped, go into blocked_analysis."""
    names, table = sequential_table(report)
    decisions, taken = stats.judge_sequential(table, looks, spent_per_look(looks, report["look"]["alpha"]),
                                              report["goal"], report["min_effect"], report.get("plan"),
                                              max_half_width=report.get("stop_half_width"))
    named = lambda arms: [names[a - 1] for a in arms]
    report["blocked_analysis"]["sequential"] = [dict(look, tested=named(look["tested"]), stopped=named(look["stopped"]),
                                                     called=named(look["called"])) for look in taken]
    return {n: d for n, d in zip(names, decisions) if d is not None}


def arms_holding_first_look(report, looks):
    """The arms (the baseline too) the sequential replay reads whose runs within the first look's seeds have no
    value yet: until they have, no look is taken."""
    first = sorted(report["variants"][report["baseline"]]["runs"], key=lambda s: int(s[4:]))[:looks[0]]
    return [n for n, v in report["variants"].items() if (n == report["baseline"] or replayable(report, v))
            and any((v["runs"].get(s) or {}).get("value") is None for s in first)]


def interim_reason(decision, looks):
    """An arm with runs still to finish, at its last look taken: its contrast there, and the look it goes on to."""
    c, last = decision["contrast"], decision["reasons"][-1]
    return dict(code="interim", look_number=last["look_number"], looks=len(looks), seeds=last["seeds"],
                level=last["level"], stop=last["stop"], mean=c["mean"], interval=decision["interval"],
                confidence=decision["interval_confidence"],
                next_seeds=looks[last["look_number"]] if last["look_number"] < len(looks) else None)


def decide_blocked(report):
    """The blocked many-to-one analysis (stats.judge_blocked) over the whole table's complete seeds (a suite that
    stops decided arms: decide_sequential); what cannot be tested keeps its blocked verdict, as in the paired
    analysis."""
    looks = report.get("stop_decided_at")
    if looks:
        holding = arms_holding_first_look(report, looks)
        decided = decide_sequential(report, looks)
    else:
        names, seeds, table = blocked_table(report)
        decisions, family = stats.judge_blocked(table, report["alpha"], report["goal"], report["min_effect"],
                                                report.get("plan")) if names else ([], None)
        report["blocked_analysis"].update(family or {})
        decided = dict(zip(names, decisions))
    for name, v in report["variants"].items():
        if name == report["baseline"]:
            continue
        if report["measurement_problems"] and not v["confounds"]:
            v["verdict"], v["reasons"] = "not comparable", [dict(code="measurement")]
        elif v["blocked"]:
            v["verdict"], v["reasons"] = v["blocked"]
            if name in decided:  # runs still to finish: no verdict, but what the looks taken so far saw
                v["reasons"] = [*v["reasons"], interim_reason(decided[name], looks)]
            elif looks and holding and replayable(report, v) and v["n"] >= looks[0]:
                v["reasons"] = [*v["reasons"], dict(code="look_waits", seeds=looks[0], arms=holding)]
        elif name in decided:
            v.update(decided[name])
        elif v["n"] >= looks[0]:  # its seeds are in, but a look needs every open arm's: it waits for theirs
            v["verdict"], v["reasons"] = "incomplete", [dict(code="look_waits", seeds=looks[0], arms=holding)]
        else:  # no look tested it yet (fewer seeds than the first look)
            v["verdict"], v["reasons"] = "too few seeds", [dict(code="too_few_seeds", n=v["n"], needed=looks[0])]
        v.setdefault("p_holm", None)
        v.setdefault("interval", None)
        del v["blocked"], v["test"]


def decide(report):
    """Holm over the family's raw p-values (stats.judge), then each comparison's verdict, with the
    interval at the level its Holm step tested. A comparison without a test counts as p = 1, so the
    family keeps its planned size k. A suite that declared the blocked analysis: decide_blocked."""
    if report.get("analysis") == "blocked":
        return decide_blocked(report)
    compared = [v for n, v in report["variants"].items() if n != report["baseline"]]
    blocked = lambda v: v["blocked"] is not None or (report["measurement_problems"] and not v["confounds"])
    decisions = stats.judge([None if blocked(v) else v["test"] for v in compared], report["alpha"], report["goal"],
                            report["min_effect"], report.get("plan"))
    for v, decision in zip(compared, decisions):
        if report["measurement_problems"] and not v["confounds"]:
            v["verdict"], v["reasons"] = "not comparable", [dict(code="measurement")]
        elif v["blocked"]:
            v["verdict"], v["reasons"] = v["blocked"]
        else:
            v.update(decision)
        v.setdefault("p_holm", None)
        v.setdefault("interval", None)
        del v["blocked"], v["test"]


def difference_sds(report):
    """{variant: (sd, degrees of freedom) of its own paired differences, or None without two}: what
    the seed planner plans each variant by (stats.plan_variants)."""
    return {n: (v["diff_sd"], len(v["differences"]) - 1) if v.get("diff_sd") is not None
            and len(v.get("differences", [])) > 1 else None
            for n, v in report["variants"].items() if n != report["baseline"]}


def fork_point(run):
    """The iteration a run left its trunk at (forking.py), None for a run trained from scratch."""
    return next((e["iter"] for e in run["events"] if e["event"] == "fork"), None)


def design(runs):
    """What the report's runs are (one design per report), as a code: "not_logged" before any run
    logged, "from_scratch", or "forked" (at the report's fork_at). render.design_text asks its question."""
    logged = [r for r in runs.values() if r["events"]]
    if not logged:
        return "not_logged"
    return "forked" if {fork_point(r) for r in logged} - {None} else "from_scratch"


def one_value(values):
    """The value every run shares, else None (a variant's learning rate: one per arm, or none to report)."""
    values = set(values)
    return values.pop() if len(values) == 1 else None


def about(reference, tokens):
    """What the report is about, from the baseline's config and checklist: the model, the data, the
    budget, the learning rate and how it was tuned (runtime's lr_tuning; '' or absent = untuned)."""
    if reference is None or reference["config"] is None:
        return None
    cfg = reference["config"]
    checklist = next((e for e in reference["events"] if e["event"] == "checklist"), {})
    return dict(model_type=cfg.get("model_type"), n_layer=cfg.get("n_layer"), n_head=cfg.get("n_head"),
                n_embd=cfg.get("n_embd"), block_size=cfg.get("block_size"), parameters=checklist.get("parameters"),
                dataset=cfg.get("dataset"), vocab_size=cfg.get("vocab_size"), max_iters=cfg.get("max_iters"),
                tokens=tokens, learning_rate=cfg.get("learning_rate"), min_lr=cfg.get("min_lr"),
                lr_tuning=cfg.get("lr_tuning") or "")


def measurement_problems(runs, allowed):
    """What makes the metric differ between any two runs of the report (variants and seeds alike): each
    problem a dict with its `code` (data_changed, designs, recipe, differs, seed_mismatch, duplicate_seed) naming
    the runs and both values. Runs without the record are left to `incomplete`."""
    problems = []
    recorded = [r for r in runs.values() if r["config"] is not None]
    if not recorded:
        return problems
    ref = recorded[0]
    name = lambda r: os.path.basename(os.path.normpath(r["out_dir"]))
    for run in recorded:
        for start in (run["info"] or {}).get("resumes", []):
            if start.get("data_changed"):
                problems.append(dict(code="data_changed", run=name(run), keys=start["data_changed"]))
    designs = {}
    for run in recorded:
        designs.setdefault(fork_point(run), []).append(name(run))
    if len(designs) > 1:
        problems.append(dict(code="designs", designs=[dict(fork_at=k, runs=names) for k, names in designs.items()]))
    first = {}  # a variant's recipe is one across its seeds (a suite re-run with another recipe adds seeds of it);
    # the measurement keys are checked across every run below, once
    for (variant, _), run in ((k, r) for k, r in runs.items() if r["config"] is not None):
        other = first.setdefault(variant, run)
        problems += [dict(code="recipe", key=k, run=name(run), value=a, other=name(other), other_value=b)
                     for k, (a, b) in config_differences(run["config"], other["config"], MEASUREMENT_KEYS).items()]
    for run in recorded[1:]:
        for key in MEASUREMENT_KEYS:
            if run["config"].get(key) != ref["config"].get(key):
                problems.append(dict(code="differs", key=key, run=name(run), value=run["config"].get(key),
                                     other=name(ref), other_value=ref["config"].get(key)))
        if not (run["info"] and ref["info"]):
            continue
        facts, ref_facts = measured_facts(run), measured_facts(ref)
        for fact in MEASUREMENT_FACTS:
            if fact == "eval_windows" and set(WINDOW_SHAPE_KEYS) & set(allowed):
                continue
            if facts.get(fact) != ref_facts.get(fact):
                problems.append(dict(code="differs", key=fact, run=name(run), value=facts.get(fact),
                                     other=name(ref), other_value=ref_facts.get(fact)))
    problems += duplicated_seeds(runs)
    unique = {json.dumps(p, sort_keys=True, default=str): p for p in problems}
    return list(unique.values())


def duplicated_seeds(runs):
    """Runs that are not the seed they are filed as, by their own record: a config whose seed is another
    (a seed-1 directory copied as seed 2), or two seeds of one variant that started from the same weights
    on the same batches (a copy: a second seed with sd 0, or a seed's values copied into another's)."""
    problems, seen = [], {}
    name = lambda r: os.path.basename(os.path.normpath(r["out_dir"]))
    for (variant, seed), run in runs.items():
        if run["config"] is not None and run["config"].get("seed") not in (None, seed):
            problems.append(dict(code="seed_mismatch", run=name(run), seed=seed, config_seed=run["config"]["seed"]))
        facts = measured_facts(run)
        if not facts.get("init_weights") or not facts.get("data_order"):
            continue
        key = (variant, json.dumps([facts["init_weights"], facts["data_order"]], sort_keys=True, default=str))
        if key in seen:
            problems.append(dict(code="duplicate_seed", run=name(run), other=name(seen[key])))
        seen.setdefault(key, run)
    return problems


# ----------------------------------------------------------------------------- evidence, cost, HellaSwag per item

TIMING_SPREAD_LIMIT = 1.5  # a run whose logged step times spread wider (90th / 10th percentile) has no trusted timing


def branch_start(run):
    """(tokens, train time) a run inherited from its trunk: (0, 0) from scratch. A branch's log counts
    on from its trunk's, so its own cost is what came after (the fork event's train_time; a log
    written before it was recorded there: the trunk's own end event); None when neither is there."""
    fork = next((e for e in run["events"] if e["event"] == "fork"), None)
    if fork is None:
        return 0, 0.0
    if fork.get("train_time") is not None:
        return fork["tokens"], fork["train_time"]
    path = trunk_dir(run, fork)
    trunk = rundir.finished(rundir.read_events(path)) if path else []
    return (fork["tokens"], trunk[-1]["train_time"]) if trunk and trunk[-1].get("train_time") else None


def trunk_dir(run, fork):
    """A branch's trunk directory: beside the branch, where sweep.py puts it (the fork event's path is
    relative to where the suite ran), else that path; None when neither exists."""
    beside = os.path.join(os.path.dirname(os.path.normpath(run["out_dir"])), os.path.basename(os.path.normpath(fork["trunk"])))
    return next((d for d in (beside, fork["trunk"]) if os.path.isdir(d)), None)


def trunk_cost(runs):
    """The trunks' cost (a forked suite: one per seed, shared by its branches), as cost() counts a
    variant's; None from scratch or when no trunk is on disk."""
    dirs = {trunk_dir(r, e) for r in runs.values() for e in r["events"] if e["event"] == "fork"} - {None}
    trunks = [dict(rundir.read_run(d)) for d in sorted(dirs)]
    for trunk in trunks:
        trunk["status"] = rundir.run_status(trunk["events"])
    return cost(trunks) if trunks else None


def run_cost(run):
    """A finished run's cost, a branch's own (its steps after the fork, not its trunk's): one throughput, its tokens over its summed training-step time (a step
    time is then tokens per step over it, never a separate median); how widely its logged step
    times spread (the first window, with compilation and allocation, aside); the highest 1-minute
    load average recorded; peak memory; parameters and model FLOPs per token from its checklist."""
    end = next((e for e in reversed(run["events"]) if e["event"] == "end"), None)
    if end is None or not end.get("train_time") or not end.get("tokens"):
        return None
    start = branch_start(run)
    if start is None:
        return None
    end = dict(end, tokens=end["tokens"] - start[0], train_time=end["train_time"] - start[1])
    if end["tokens"] <= 0 or end["train_time"] <= 0:
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


def timing_flagged(row):
    return row["step_time_spread"] is not None and row["step_time_spread"] > TIMING_SPREAD_LIMIT


def cost(runs):
    """A variant's cost over its finished runs: the median throughput and its range over the seeds
    whose timings are trusted (all seeds when none is), the step time that follows from it, peak
    memory, parameters, FLOPs per token, and which runs' timings are not to be trusted (step times
    spread beyond TIMING_SPREAD_LIMIT: other work on the machine, a cause outside the variant)."""
    rows = [c for c in (run_cost(r) for r in runs if r["status"] == "finished") if c]
    if not rows:
        return None
    timed = [r for r in rows if not timing_flagged(r)]
    speed = [r["tokens_per_sec"] for r in timed or rows]
    one = lambda key: next((r[key] for r in rows if r[key] is not None), None)
    out = dict(runs=len(rows), timed_runs=len(timed), tokens_per_sec=float(np.median(speed)),
               tokens_per_sec_range=[min(speed), max(speed)],
               parameters=one("parameters"), flops_per_token=one("flops_per_token"),
               tokens_per_iter=one("tokens_per_iter"), max_load=max((r["max_load"] for r in rows
                                                                    if r["max_load"] is not None), default=None),
               peak_memory_mib=float(np.median(m)) if (m := [r["peak_memory_mib"] for r in rows
                                                              if r["peak_memory_mib"] is not None]) else None,
               unreliable=[dict(run=r["name"], spread=r["step_time_spread"]) for r in rows if timing_flagged(r)])
    out["step_time_ms"] = 1000 * out["tokens_per_iter"] / out["tokens_per_sec"] if out["tokens_per_iter"] else None
    return out




MATCHED_TOLERANCE = 0.01  # a run's end stands for the equal-FLOPs point only within 1% of the budget's FLOPs


def equal_flops_tokens(tokens, fork_tokens, base_flops, own_flops):
    """The token count at which a variant has spent the baseline's model FLOPs of `tokens`: the first
    fork_tokens are its trunk's (the baseline's model, at the baseline's rate), the rest at its own
    FLOPs per token (fork_tokens 0 from scratch). sweep.py's schedule-end runs end there."""
    return fork_tokens + (tokens - fork_tokens) * base_flops / own_flops


def fork_tokens(run):
    """The tokens a run's trunk trained before the fork (0 for a run from scratch)."""
    return next((e["tokens"] for e in run["events"] if e["event"] == "fork"), 0)


def final_at_flops(run, metric, budget, base_flops, own_flops):
    """(tokens, value) of a finished run's final evaluation, or (tokens, None) when it spent more than
    MATCHED_TOLERANCE of `budget` model FLOPs away from the budget (the trunk's tokens at base_flops per
    token, its own after a fork): only the end of a schedule, never a value read before it (the learning
    rate is still decaying there) nor one interpolated between evaluations."""
    curve = metric_by_tokens(run, metric)
    if rundir.run_status(run["events"]) != "finished" or not curve:
        return None, None
    tokens, start = max(curve), fork_tokens(run)
    close = abs(base_flops * start + own_flops * (tokens - start) - budget) <= MATCHED_TOLERANCE * budget
    return tokens, curve[tokens] if close and math.isfinite(curve[tokens]) else None


def compute_matched(report, runs, variant, seeds, base_seeds, schedule_end):
    """The variant's metric at the baseline's model FLOPs of the compared point (its FLOPs per token x
    compared tokens), from runs whose own schedule ends there, paired with the baseline seed: an idea
    that costs more per token is not flattered by an equal-token comparison, nor by a value read
    mid-schedule. A variant that costs the same reads its own runs; one that costs more or less its
    schedule-end runs (schedule_end, {(variant, seed): run}; sweep.py's equal_flops_runs), or it has none
    (read_from None). A seed whose run did not end within MATCHED_TOLERANCE of the budget is named and gets no
    value. The family's verdicts come afterwards (judge_compute_matched: Holm over this view's own family)."""
    base_cost, own_cost = report["variants"][report["baseline"]].get("cost"), report["variants"][variant].get("cost")
    tokens = report["compared_at_tokens"]
    if not (base_cost and own_cost and base_cost["flops_per_token"] and own_cost["flops_per_token"] and tokens):
        return None
    base_flops, own_flops = base_cost["flops_per_token"], own_cost["flops_per_token"]
    flops = base_flops * tokens
    read_from = "own_runs" if own_flops == base_flops else "schedule_end" if any(v == variant for v, _ in schedule_end) \
        else None
    ending = runs if read_from == "own_runs" else schedule_end
    matched = min(equal_flops_tokens(tokens, fork_tokens(runs[(variant, s)]), base_flops, own_flops) for s in seeds)
    values, evaluated_at, diffs = {}, {}, []
    for seed in seeds if read_from else ():
        run, base = ending.get((variant, seed)), runs.get((report["baseline"], seed))
        if seed in base_seeds and base["status"] == "finished":
            at, mine = final_at_flops(run, report["metric"], flops, base_flops, own_flops) if run else (None, None)
            theirs = metric_by_tokens(base, report["metric"]).get(tokens)
            values[seed], evaluated_at[seed] = mine, at
            if mine is not None and theirs is not None and math.isfinite(theirs):
                diffs.append(mine - theirs)
    missing = [dict(seed=f"seed{s}", closest=evaluated_at[s]) for s, v in values.items() if v is None]
    return dict(flops=flops, tokens=matched,
                flops_ratio=own_flops / base_flops, tolerance=MATCHED_TOLERANCE, read_from=read_from,
                evaluated_at={f"seed{s}": t for s, t in evaluated_at.items()},
                values={f"seed{s}": v for s, v in values.items()}, differences=diffs, missing=missing)


def hellaswag_items(run, tokens):
    """{example digest: record} of a run's per-example HellaSwag scores at `tokens` (train.py's
    hellaswag_items.jsonl); a torn line is skipped."""
    path = os.path.join(run["out_dir"], rundir.HELLASWAG_ITEMS)
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
    """Where a HellaSwag difference comes from, item by item (evidence, not the verdict: items within
    a seed are not independent of the seed): on the items both runs of a seed scored, how many only
    the variant and how many only the baseline got right, summed over the paired seeds."""
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
    return dict(metric=key, items=len(common), seeds=[s for s, _, _ in pairs], diff=float(d.mean()),
                variant_only=int((d > 0).sum()), baseline_only=int((d < 0).sum()))


def hellaswag_at(run, tokens):
    """A finished run's HellaSwag record at `tokens` (n, acc, acc_norm), or None."""
    at = [e for e in run["events"] if e["event"] == "hellaswag" and e["tokens"] == tokens]
    if run.get("status") != "finished" or not at or not all(math.isfinite(at[-1][k]) for k in ("acc", "acc_norm")):
        return None
    return at[-1]


def hellaswag_pooled(records, confidence):
    """A variant's HellaSwag accuracy pooled over its seeds' records, with a Clopper-Pearson interval
    at `confidence` and whether chance (0.25) lies inside it: a description, not the comparison."""
    total = sum(r["n"] for r in records)
    out = dict(n=total, confidence=confidence)
    for key in ("acc", "acc_norm"):
        right = sum(round(r[key] * r["n"]) for r in records)
        ci = binomial_interval(right, total, confidence)
        out[key] = dict(value=right / total, interval=ci, chance_inside=ci[0] <= CHANCE["hellaswag_" + key] <= ci[1])
    return out


def add_hellaswag(report, suite, runs, key="acc_norm"):
    """HellaSwag judged like the metric: per variant the paired difference of each seed's accuracy
    (the seed is the unit: its items share one model, so items x seeds are not independent), Holm
    over the family at the report's alpha; beside it each variant's pooled accuracy at the family level."""
    tokens, baseline = report["hellaswag_tokens"], report["baseline"]
    if tokens is None:
        return
    scores = {key_: hellaswag_at(run, tokens) for key_, run in runs.items()}
    for variant, seeds in suite["variants"].items():
        records = [scores[(variant, s)] for s in seeds if scores[(variant, s)]]
        if records:
            report["variants"][variant]["hellaswag"] = hellaswag_pooled(records, 1 - report["level"])
    compared, tests = [], []
    for variant, seeds in suite["variants"].items():
        if variant != baseline:
            pairs = [(s, scores[(variant, s)][key] - scores[(baseline, s)][key]) for s in seeds
                     if scores[(variant, s)] and scores.get((baseline, s))]
            compared.append((variant, pairs))
            tests.append(stats.paired_test([d for _, d in pairs]) if pairs else None)
    for (variant, pairs), test, decision in zip(compared, tests, stats.judge(tests, report["alpha"], "higher")):
        if test is not None:
            report["variants"][variant]["hellaswag_paired"] = dict(
                metric=key, seeds=[s for s, _ in pairs], differences=[d for _, d in pairs], diff_mean=test["mean"],
                p_value=test["p"], **decision)


def add_evidence(report, suite, runs, schedule_end=None):
    """What the comparison rests on, per variant: cost and its ratios to the baseline (throughput over
    the runs whose timings are trusted; no ratio where half or more of either side's are flagged), the
    per-seed differences with their signs and sign-flip p, the compute-matched view (Holm over its own
    family) and HellaSwag item by item."""
    baseline = report["baseline"]
    by_variant = {v: {s: runs[(v, s)] for s in seeds} for v, seeds in suite["variants"].items()}
    for variant, entry in report["variants"].items():
        entry["cost"] = cost(by_variant[variant].values())
    base_cost = report["variants"][baseline]["cost"]
    report["trunk_cost"] = trunk_cost(runs)
    for variant, entry in report["variants"].items():
        if entry["cost"] and base_cost:
            entry["cost_ratio"] = {k: entry["cost"][k] / base_cost[k] for k in
                                   ("tokens_per_sec", "parameters", "flops_per_token", "peak_memory_mib")
                                   if entry["cost"][k] and base_cost[k]}
            untimed = [c for c in (entry["cost"], base_cost) if 2 * c["timed_runs"] <= c["runs"]]
            if untimed:  # a ratio of few or untrusted timings reads as a measurement; say why there is none
                entry["cost_ratio"].pop("tokens_per_sec", None)
                entry["cost_ratio"]["tokens_per_sec_withheld"] = [u for c in untimed for u in c["unreliable"]]
        if variant == baseline:
            continue
        entry["signs"] = stats.sign_flip_test(entry.get("differences") or [])
        entry["compute_matched"] = compute_matched(report, runs, variant, suite["variants"][variant],
                                                   suite["variants"][baseline], schedule_end or {})
        per_item = hellaswag_per_item(by_variant[variant], by_variant[baseline], report["hellaswag_tokens"])
        if per_item:
            entry["hellaswag_per_item"] = per_item
    judge_compute_matched(report)


def judge_compute_matched(report):
    """The equal-FLOPs view is a family of its own: Holm over its k comparisons at the report's alpha,
    each interval at its Holm step's level, as in the main table."""
    compared = [v for n, v in report["variants"].items() if v.get("compute_matched")]
    matched = [v["compute_matched"] for v in compared]
    # a pair the main table cannot judge (not comparable, incomplete) gets no verdict here either
    unjudged = [v.get("verdict") in ("not comparable", "incomplete") for v in compared]
    tests = [stats.paired_test(m["differences"]) if m["differences"] and not m["missing"] and not skip else None
             for m, skip in zip(matched, unjudged)]
    for v, m, skip, test, decision in zip(compared, matched, unjudged, tests,
                                          stats.judge(tests, report["alpha"], report["goal"], report["min_effect"])):
        reason = dict(code="no_schedule_end_run") if m["read_from"] is None else \
            dict(code="not_evaluated", missing=m["missing"], tolerance=m["tolerance"]) if m["missing"] else \
            dict(code="no_paired_seed_at_flops")
        blocked = dict(verdict="not evaluated", interval=None, p_holm=None, reasons=[reason])
        if skip:
            blocked.update(verdict=v["verdict"], reasons=[dict(code="main_table", verdict=v["verdict"],
                                                                reasons=v["reasons"])])
        m.update(diff_mean=test["mean"] if test else None, p_value=test["p"] if test else None,
                 **(decision or blocked))


# ----------------------------------------------------------------------------- where runs come from


