"""Does an effect hold across model sizes? An ablation suite run at every size of a ladder, and the
effect's trend against size.

A suite declares `ladder = dict(sizes={name: {shape keys}}, reference=name, tokens=(base, power),
learning_rate=(base, power), alpha=..., extrapolate_to=(name, {shape keys}))`. Each size overlays
model-shape keys (SHAPE_KEYS) on every variant's recipe; the token budget and learning rate follow
the declared power laws from the recipe, which is taken to be the reference size's:
    tokens_size = tokens_recipe x (B_size / B_reference) ** power  (max_iters; warmup and decay scale with it)
    lr_size = lr_recipe x (B_size / B_reference) ** power          (learning_rate and min_lr)
where the base B is "params" (non-embedding parameters 12 n_layer n_embd^2, Kaplan et al. 2020) or
"width" (n_embd; power -1 is the muP-style 1/width rule of Adam's hidden learning rate, applied here
to every weight: a width rule, not muP's parametrization). sweep.py writes the results into each
run's arguments, so every run's config.json records what it ran with.

Within one size the suite is an ordinary one: its runs live in suite_dir/<size>/ with their own
suite.json, one family per size (Holm within it), and python report.py suite_dir/<size> reports
it alone. Across sizes the ladder's keys are the only ones allowed to differ (across_size_problems).
The across-size statement, per variant: the paired effect at each size; per seed, the line of that
seed's differences against ln N, and their mean line with t intervals over seeds at the declared
level (Bonferroni over the k variants); a trend (grows, shrinks, flips, no trend detectable,
incomplete, or withheld while the learning-rate check or a size's forked verdicts do not stand) and
the mean line extrapolated to a named size, stated as an extrapolation. The numbers are plain data
(report.json); ablation/render.py words and draws them.
"""
import glob
import math
import os
import re

import numpy as np

import rundir
from ablation import compare, ladder_power

SHAPE_KEYS = ("n_layer", "n_embd", "n_head", "mla_latent_dim")  # what a size may overlay
RULE_BASES = ("params", "width")
# What the rules set, in every run's arguments: scaled from the recipe's own values.
TOKEN_KEYS = ("max_iters", "warmup_iters", "lr_decay_iters")
LR_KEYS = ("learning_rate", "min_lr")
RULE_KEYS = TOKEN_KEYS + LR_KEYS


def non_embedding_params(shape):
    """12 n_layer n_embd^2: the attention (4 d^2) and MLP (8 d^2) weights of every block, the N of
    Kaplan et al. (2020) scaling laws; embeddings, biases and norms left out."""
    return 12 * shape["n_layer"] * shape["n_embd"] ** 2


def rule_factor(rule, shape, reference):
    base, power = rule
    measure = non_embedding_params if base == "params" else (lambda s: s["n_embd"])
    return (measure(shape) / measure(reference)) ** power


def size_keys(ladder, recipe):
    """{size: the keys a run of that size gets}: the size's shape, the recipe's token budget and
    schedule scaled by the token rule, its learning rates by the learning-rate rule. `recipe` is a
    variant's resolved config (train.py keys) before any size is applied, of the reference size's shape
    (suites.check_ladder_recipe checks it)."""
    reference = ladder["sizes"][ladder["reference"]]
    out = {}
    for size, shape in ladder["sizes"].items():
        tokens = rule_factor(ladder["tokens"], shape, reference)
        lr = rule_factor(ladder["learning_rate"], shape, reference)
        keys = dict(shape, max_iters=max(1, round(recipe["max_iters"] * tokens)),
                    warmup_iters=round(recipe["warmup_iters"] * tokens),
                    learning_rate=float(f"{recipe['learning_rate'] * lr:.4g}"),
                    min_lr=float(f"{recipe['min_lr'] * lr:.4g}"))
        if recipe["lr_decay_iters"]:
            keys["lr_decay_iters"] = round(recipe["lr_decay_iters"] * tokens)
        out[size] = keys
    return out


def across_size_problems(base_configs, ladder):
    """The baseline's resolved config at each size against the reference size's: any difference in a
    key the ladder does not set is a confound of the across-size view, as (size, key, value, the
    reference size's value)."""
    reference = base_configs[ladder["reference"]]
    return [(size, key, value, theirs) for size, cfg in base_configs.items()
            for key, (value, theirs) in compare.config_differences(cfg, reference, SHAPE_KEYS + RULE_KEYS).items()]


def size_of(run_name):
    """'w64/baseline-seed1' -> ('w64', 'baseline-seed1')."""
    size, _, name = run_name.partition("/")
    return size, name


# ----------------------------------------------------------------------------- the across-size statement

def size_effect(report, variant, shape):
    """One variant's paired effect at one size, from that size's report (ablation.compare): each
    seed's paired difference, their mean, the Holm-step interval and verdict of the size's family,
    why its forked verdict does not stand (ablation/bridge.py: does_not_stand), N, and the training
    compute at the compared point (the variant's FLOPs per token x tokens)."""
    v = report["variants"].get(variant)
    cost = (v or {}).get("cost") or {}
    out = dict(params=non_embedding_params(shape), measured_parameters=cost.get("parameters"),
               compute=(cost["flops_per_token"] * report["compared_at_tokens"]
                        if cost.get("flops_per_token") and report["compared_at_tokens"] else None),
               tokens=report["compared_at_tokens"], n=0, diff=None, differences={}, interval=None,
               interval_confidence=None, verdict="incomplete", reasons=[dict(code="no_run_at_size")],
               does_not_stand=(report.get("does_not_stand") or {}).get(variant) or [])
    if v is None:
        return out
    diffs = v.get("differences") or []
    out.update(n=len(diffs), diff=v.get("diff_mean"), interval=v.get("interval"),
               differences=dict(zip(map(str, v.get("paired_seeds") or []), diffs)),  # by seed: a line per seed
               interval_confidence=v.get("interval_confidence"), p_holm=v.get("p_holm"), verdict=v["verdict"],
               reasons=v["reasons"])
    return out


def unusable(effect):
    """Why a size's effect cannot enter the fit (None when it can): its verdict and reasons."""
    if effect["verdict"] in ("incomplete", "not comparable"):
        return dict(verdict=effect["verdict"], reasons=effect["reasons"])
    return None


def complete_seeds(effects):
    """(the seeds with a paired difference at every size, {each other seed: the sizes it lacks})."""
    every = set.union(*(set(e["differences"]) for e in effects))
    lacking = {s: [e["size"] for e in effects if s not in e["differences"]] for s in sorted(every, key=int)}
    return [s for s, sizes in lacking.items() if not sizes], {s: sizes for s, sizes in lacking.items() if sizes}


def fit_trend(effects, level, target_params=None):
    """The trend from per-seed lines: for each seed with a paired difference at every size, the
    least-squares line of its differences on ln N; the trend is the seeds' mean line, its slope (per
    e-fold of N) tested by a one-sample t over the seeds' slopes, with df = seeds - 1 (scipy), and
    intervals at confidence 1 - level. Every size shares each seed's data order, so the sizes of one
    seed are correlated; a seed's line depends on that seed's runs alone, so the lines of different
    seeds are independent and the t over seeds keeps its level under any correlation across sizes
    (tests/test_ladder.py simulates it; a weighted fit of the per-size means that treats sizes as
    independent rejects a flat truth too often when a seed's difference drifts with N). Seeds missing
    a size are left out (named in `left_out`). Returns the mean slope, its interval and p, the mean
    (intercept, slope) with its covariance over seeds (so `fitted` gives the mean line and its
    interval at any N), the fitted effect at the ladder's ends, at its centre, and at target_params."""
    from scipy import stats as sps
    seeds, left_out = complete_seeds(effects)
    x = np.log([e["params"] for e in effects])
    diffs = np.array([[e["differences"][s] for s in seeds] for e in effects])  # (sizes, seeds)
    lines = np.polynomial.polynomial.polyfit(x, diffs, 1)  # (intercept, slope) of each seed: (2, seeds)
    n = len(seeds)
    cov = (np.cov(lines) / n).tolist()  # of the mean line: each seed's line is one independent draw
    df = n - 1
    out = dict(seeds=seeds, left_out=left_out, seed_slopes=dict(zip(seeds, lines[1].tolist())),
               intercept=float(lines[0].mean()), slope=float(lines[1].mean()), cov=cov, slope_se=math.sqrt(cov[1][1]),
               confidence=1 - level, df=df, quantile=float(sps.t.isf(level / 2, df)))
    out.update(slope_interval=[out["slope"] - out["quantile"] * out["slope_se"],
                               out["slope"] + out["quantile"] * out["slope_se"]],
               p=float(sps.ttest_1samp(lines[1], 0.0).pvalue) if out["slope_se"] else None,
               smallest=fitted(out, math.exp(x.min())), largest=fitted(out, math.exp(x.max())),
               centre=fitted(out, math.exp(x.mean())))
    if target_params:  # an interval only within one ladder width past the largest size
        out["extrapolated"] = ladder_power.bound_extrapolation(fitted(out, target_params), np.exp(x).tolist())
    return out


def fitted(fit, params):
    """The fitted effect at N = params and its interval at the fit's confidence."""
    row = np.array([1.0, math.log(params)])
    mean = float(row @ [fit["intercept"], fit["slope"]])
    half = fit["quantile"] * math.sqrt(float(row @ np.array(fit["cov"]) @ row))
    return dict(params=float(params), effect=mean, interval=[mean - half, mean + half])


def classify(effects, fit, goal):
    """(trend, reasons): flips when the sign change is established (decided effects of opposite sign at
    two sizes, or the fit's intervals at the ladder's two ends on opposite sides of 0); grows or
    shrinks when the slope's interval excludes 0 (grows: away from zero, judged at the centre of the
    ladder in ln N); else no trend detectable."""
    decided = {e["size"]: e["verdict"] for e in effects if e["verdict"] in ("better", "worse")}
    if len(set(decided.values())) == 2:
        return "flips", [dict(code="decided_opposite", verdicts=decided)]
    low, high = fit["smallest"]["interval"], fit["largest"]["interval"]
    ends = [1 if lo > 0 else -1 if hi < 0 else 0 for lo, hi in (low, high)]
    lo, hi = fit["slope_interval"]
    if ends[0] * ends[1] < 0:
        return "flips", [dict(code="ends_opposite", confidence=fit["confidence"], smallest=low, largest=high)]
    if lo <= 0 <= hi:
        return "no trend detectable", [dict(code="slope_holds_zero", confidence=fit["confidence"], interval=[lo, hi])]
    away = (fit["slope"] > 0) == (fit["centre"]["effect"] > 0)
    better = (fit["slope"] < 0) == (goal == "lower")
    crosses = fit["smallest"]["effect"] * fit["largest"]["effect"] < 0
    return ("grows" if away else "shrinks"), [dict(code="slope_excludes_zero", confidence=fit["confidence"],
                                                   interval=[lo, hi], away=away, better=better, crosses=crosses)]


def withheld_because(effects, checked, sizes):
    """Why no trend may be stated, as reasons (None when one may): the learning-rate check does not
    support the rule's rate at a checked end (lr_check: 1x beaten by more than the margin, fewer than
    two factors finished, 1x not finished or diverged, or not run), or a size's forked verdict does not
    stand (ablation/bridge.py: a loss jump at the fork beyond the margin, a bridge that does not
    confirm). Either way the effect at each size answers another question than "does it help, and more
    so as N grows?": against an untuned baseline, or shaped by the fork's shock, a trend can be the
    rule's or the design's, not the variant's."""
    reasons = []
    if checked is not None:  # the ladder declared lr_check: its smallest and largest size are checked
        by_n = sorted(sizes, key=lambda name: non_embedding_params(sizes[name]))
        failing = []
        for end in dict.fromkeys((by_n[0], by_n[-1])):
            row = checked["sizes"].get(end)
            if row is None:
                failing.append(dict(code="not_run", size=end))
            elif len(row["values"]) < 2:  # a lone finished rate is "best" by default, which checks nothing
                failing.append(dict(code="too_few_factors", size=end, finished=len(row["values"]),
                                    factors=len(checked["factors"])))
            elif row["holds"] != "yes":
                failing.append(dict(code="rule_fails", size=end, **row))
        if failing:
            reasons.append(dict(code="lr_check_fails", sizes=failing))
    standing = {e["size"]: e["does_not_stand"] for e in effects if e["does_not_stand"]}
    if standing:
        reasons.append(dict(code="forked_does_not_stand", sizes=standing))
    return reasons or None


def across_sizes(ladder, reports, goal, lr_checked=None):
    """The ladder's comparison as plain data. reports: {size: ablation.compare result}; lr_checked: the
    ladder's learning-rate checks (lr_check; None when it declares none). Per variant: the effect at
    every declared size, the per-seed fit and its trend; a variant missing a size (or without a usable
    effect there, or with fewer than 2 seeds at every size) is incomplete, never fitted on the sizes
    it has; its trend is withheld (the fit kept as data) while withheld_because names a reason."""
    variants = list(dict.fromkeys(v for r in reports.values() for v in r["variants"] if v != r["baseline"]))
    k = len(variants)
    level = ladder["alpha"] / max(1, k)  # Bonferroni: k across-size statements at family-wise alpha
    target = ladder["extrapolate_to"]
    out = dict(sizes={s: dict(shape=shape, params=non_embedding_params(shape)) for s, shape in ladder["sizes"].items()},
               reference=ladder["reference"], tokens_rule=list(ladder["tokens"]),
               learning_rate_rule=list(ladder["learning_rate"]), alpha=ladder["alpha"], level=level, comparisons=k,
               extrapolate_to=dict(name=target[0], shape=target[1], params=non_embedding_params(target[1]))
               if target else None, variants={})
    for variant in variants:
        effects = []
        for size, shape in ladder["sizes"].items():
            report = reports.get(size)
            effect = size_effect(report, variant, shape) if report else dict(
                params=non_embedding_params(shape), n=0, diff=None, differences={}, verdict="incomplete",
                reasons=[dict(code="no_runs_at_size")], does_not_stand=[])
            effects.append(dict(effect, size=size))
        missing = {e["size"]: unusable(e) for e in effects if unusable(e)}
        seeds, left_out = complete_seeds(effects)
        entry = dict(effects=effects, fit=None)
        if missing:
            entry["trend"], entry["reasons"] = "incomplete", [dict(code="size_unusable", sizes=missing)]
        elif len(seeds) < 2:
            entry["trend"], entry["reasons"] = "incomplete", [dict(code="too_few_complete_seeds", seeds=len(seeds),
                                                                   left_out=left_out)]
        else:
            fit = fit_trend(effects, level, out["extrapolate_to"]["params"] if target else None)
            if not fit["slope_se"]:
                entry["trend"], entry["reasons"] = "incomplete", [dict(code="same_slope")]
            else:
                entry["fit"] = fit
                entry["detectable"] = ladder_power.ladder_detectable(effects, len(seeds), level)  # 80% power, simulated
                withheld = withheld_because(effects, lr_checked, ladder["sizes"])
                entry["trend"], entry["reasons"] = ("withheld", withheld) if withheld else classify(effects, fit, goal)
        out["variants"][variant] = entry
    return out


# ----------------------------------------------------------------------------- planning, compute and the learning-rate checks

def plan(ladder, n_seeds, k):
    """sweep.py --plan for a ladder, as data (render.ladder_plan_lines words it): its span in e-folds of N,
    the steps at every size against the recipe's, the extrapolation limit, and the slope its per-seed test
    can detect at 80% power from the paired-difference sd it declares (ladder['sd'], from a pilot), sizes
    independent (ablation/ladder_power.py: the conservative case for a shared seed)."""
    params = [non_embedding_params(s) for s in ladder["sizes"].values()]
    x = np.log(params)
    reference = ladder["sizes"][ladder["reference"]]
    steps = {name: rule_factor(ladder["tokens"], s, reference) for name, s in ladder["sizes"].items()}
    level = ladder["alpha"] / max(1, k)
    sd = ladder.get("sd")
    return dict(sizes=len(params), span=float(np.ptp(x)), smallest=min(params), largest=max(params), steps=steps,
                same_steps=all(abs(f - 1) < 1e-12 for f in steps.values()),
                limit=ladder_power.extrapolation_limit(params), sd=sd, seeds=n_seeds, level=level,
                alpha=ladder["alpha"], comparisons=k,
                slope=ladder_power.detectable_slope(x, sd, n_seeds, level) if sd else None)


def lr_check(suite_dir, declared):
    """The ladder's learning-rate checks (sweep.py lr_check_points) as found in suite_dir: per checked size
    the metric of each factor's run at its last evaluation ("diverged" for one that did), the best factor,
    and whether the rule's 1x holds: "yes" (not beaten by more than min_effect, or at all without one),
    "beaten" (by `by`), "diverged" (1x did), "incomplete" (the `missing` factors have not finished).
    None without checks."""
    factors = (declared.get("ladder") or {}).get("lr_check")
    if not factors:
        return None
    event, field, goal = compare.METRICS[declared["metric"]]
    margin = declared.get("min_effect") or 0.0
    sizes = {}
    sign = 1 if goal == "lower" else -1
    for size in declared["ladder"]["sizes"]:
        values = {}
        for path in sorted(glob.glob(os.path.join(suite_dir, size, "lrcheck-x*-seed*"))):
            events = rundir.read_events(path)
            evals = [e[field] for e in events if e["event"] == event and field in e]
            factor = re.match(r"lrcheck-x([\d.e+-]+)-seed", os.path.basename(path)).group(1)
            if rundir.run_status(events) == "finished" and evals:
                values[factor] = evals[-1]
            elif rundir.run_status(events) == "diverged":  # an outcome: that rate is too high to train
                values[factor] = "diverged"
        if not values:
            continue
        trained = {f: v for f, v in values.items() if v != "diverged"}
        best = min(trained, key=lambda f: sign * trained[f], default=None)
        missing = [f"{f:g}" for f in [1.0, *factors] if f"{f:g}" not in values]
        row = dict(values=values, best=f"{best}x" if best else None)
        if missing:  # the rule holds only against the factors that ran: a lone 1x holds against nothing
            row.update(holds="incomplete", missing=missing)
        elif values["1"] == "diverged":
            row.update(holds="diverged")
        elif sign * (values["1"] - trained[best]) <= margin:
            row.update(holds="yes")
        else:
            row.update(holds="beaten", by=abs(values["1"] - trained[best]))
        sizes[size] = row
    return dict(factors=[1.0, *factors], sizes=sizes, margin=margin)


PEAK_FLOPS, MFU = 989e12, 0.4  # an H100's dense bf16 peak; the model-FLOPs utilization the estimate assumes


def training_compute(run_cfgs, fork_at=None):
    """sweep.py --plan for a ladder: the training compute of its runs, 6 N D with N the non-embedding
    parameters (Kaplan et al. 2020) and D the tokens each run trains (a branch from its fork on, a
    trunk to it), in total and by shape, and the GPU-hours that is at MFU of an H100's peak (an
    assumption, which render.compute_lines states)."""
    by_size, total = {}, 0.0
    for cfg in run_cfgs:
        iters = cfg["max_iters"] - (fork_at if cfg.get("fork_from") and fork_at else 0)  # a branch trains from its fork
        flops = 6 * non_embedding_params(cfg) * iters * cfg["tokens_per_iter"]
        key = (cfg["n_layer"], cfg["n_embd"])
        by_size[key] = by_size.get(key, 0.0) + flops
        total += flops
    hours = lambda f: f / (MFU * PEAK_FLOPS) / 3600
    return dict(flops=total, hours=hours(total), mfu=MFU, peak_flops=PEAK_FLOPS,
                by_size=[dict(n_layer=layers, n_embd=width, hours=hours(f)) for (layers, width), f in by_size.items()])
