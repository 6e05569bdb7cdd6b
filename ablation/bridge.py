"""How far a forked answer carries: the bridge from forked to from-scratch effects, and the loss jump
at the fork.

A forked suite (fork_at) answers "after fork_at steps of the baseline, does switching to the variant
beat continuing the baseline?". A suite that also declares `bridge_seeds` trains every variant from
scratch on those seeds (sweep.py: runs `scratch-<variant>-seed<s>`, paired with a scratch baseline,
listed apart in suite.json as `bridge_runs` and never pooled with the forked runs). Per variant this
module puts the forked effect beside the from-scratch one:
- their ratio, forked / from scratch, with Fieller's interval for a ratio of two independent means
  (Fieller 1954): the set of r for which (a - r b)^2 <= t^2 (se_a^2 + r^2 se_b^2). It is a bounded
  interval only when the from-scratch mean is itself distinguishable from 0 (b^2 > t^2 se_b^2);
  otherwise the set is unbounded and the report says so instead of printing a number. t is Student's
  at the family's per-comparison level (Bonferroni over the k variants) with min(n) - 1 degrees of
  freedom (conservative: each mean's variance comes from its own few seeds). The forked and scratch
  runs share seeds but not training, so they are treated as independent;
- whether the signs agree, and the bridge's status: "confirms" (the ratio's interval is bounded and
  lies above 0: the forked effect points where the from-scratch one does), "disagrees" (the
  estimates have opposite signs), "unbounded" (the from-scratch effect cannot be told from 0, so no
  ratio can be bounded), "cannot bound away from 0" (same signs, but the interval reaches 0 or below),
  "incomplete" (a forked or from-scratch run of the variant or of the baseline did not finish: named).
Anything but "confirms" means the forked verdict does not stand as an answer to "does it help?".

The loss jump: each branch's first evaluation (at the fork point) minus its seed's baseline branch's.
A variant whose new parameters start cold (or whose architecture changes the function outright)
starts the comparison from a shock that the rest of the budget only recovers from; a mean jump
beyond the suite's min_effect is named as a design problem, not an effect.

Numbers only (report.json); ablation/render.py words them.
"""
import math
import os

import numpy as np

from ablation import compare

CONFIRMS = "confirms"


def fieller(a, se_a, b, se_b, t):
    """(kind, interval) of the ratio a / b: kind 'bounded' with [lo, hi], or 'unbounded' with None
    (the denominator's interval contains 0: the set of ratios is the whole line or the outside of an
    interval, no honest bounds)."""
    qa, qb = (t * se_a) ** 2, (t * se_b) ** 2
    A = b * b - qb
    if A <= 0:
        return "unbounded", None
    B = a * b
    C = a * a - qa
    disc = B * B - A * C
    root = math.sqrt(max(disc, 0.0))
    return "bounded", [(B - root) / A, (B + root) / A]


def mean_se(diffs):
    d = np.asarray(diffs, dtype=np.float64)
    if len(d) < 2:
        return (float(d.mean()) if len(d) else None), None
    return float(d.mean()), float(d.std(ddof=1) / math.sqrt(len(d)))


def ratio(forked_diffs, scratch_diffs, level):
    """The bridge of one variant: forked and from-scratch mean effects, their ratio with Fieller's
    interval at confidence 1 - level, whether the signs agree, and the status (module docstring)."""
    from scipy import stats as sps
    a, se_a = mean_se(forked_diffs)
    b, se_b = mean_se(scratch_diffs)
    out = dict(forked=a, forked_se=se_a, scratch=b, scratch_se=se_b, forked_n=len(forked_diffs),
               scratch_n=len(scratch_diffs), confidence=1 - level, ratio=None, interval=None, kind=None,
               signs_agree=None, status="incomplete")
    if a is None or b is None or se_a is None or se_b is None:
        out["why"] = "fewer than 2 paired seeds in the forked or the from-scratch comparison"
        return out
    out["ratio"] = a / b if b != 0 else None
    out["signs_agree"] = bool(a * b > 0)
    df = min(len(forked_diffs), len(scratch_diffs)) - 1
    t = float(sps.t.isf(level / 2, df))
    out["df"], out["t"] = df, t
    out["kind"], out["interval"] = fieller(a, se_a, b, se_b, t)
    if not out["signs_agree"]:
        out["status"], out["why"] = "disagrees", "the forked and from-scratch effects have opposite signs"
    elif out["kind"] == "unbounded":
        out["status"], out["why"] = "unbounded", (f"the from-scratch effect {b:+.4g} (se {se_b:.2g}) cannot be told "
                                                  f"from 0 at this level, so the ratio has no bounded interval")
    elif out["interval"][0] > 0:
        out["status"], out["why"] = CONFIRMS, "the ratio's interval is bounded and above 0"
    else:
        out["status"], out["why"] = "cannot bound away from 0", "the ratio's interval reaches 0"
    return out


def bridge(report, scratch):
    """Per compared variant, the bridge between the forked report and the from-scratch one (both
    ablation.compare results over the same variants); level: the forked family's per-comparison
    level (Bonferroni over k)."""
    out = {}
    for name, v in report["variants"].items():
        if name == report["baseline"]:
            continue
        s = scratch["variants"].get(name)
        entry = ratio(v.get("differences") or [], (s or {}).get("differences") or [], report["level"])
        entry.update(forked_verdict=v.get("verdict"), scratch_verdict=(s or {}).get("verdict", "no runs"),
                     scratch_interval=(s or {}).get("interval"))
        unfinished = unfinished_runs(v, report["variants"].get(report["baseline"]), s,
                                     scratch["variants"].get(scratch.get("baseline")))
        if unfinished:  # the seeds that finished may disagree in sign where all of them would not
            entry.update(status="incomplete", why=f"not finished: {', '.join(unfinished)}")
        out[name] = entry
    return out


def unfinished_runs(*entries):
    """'scratch-gated-seed2 diverged', ...: the runs of these compare entries (a variant's forked or
    from-scratch runs, or their baselines') that did not finish, by directory."""
    return [f"{os.path.basename(os.path.normpath(r['out_dir']))} {r['status']}" for e in entries
            for r in (e or {}).get("runs", {}).values() if r["status"] != "finished"]


def fork_jumps(report, runs):
    """{variant: dict(per_seed, mean, beyond_margin)}: each branch's first evaluation of the metric
    after its fork minus its seed's baseline branch's (None for a design that did not fork)."""
    metric, baseline = report["metric"], report["baseline"]
    field = compare.METRICS[metric][1]

    def first(run):
        fork = next((e for e in run["events"] if e["event"] == "fork"), None)
        if fork is None:
            return None
        return next((e[field] for e in run["events"] if e["event"] == compare.METRICS[metric][0]
                     and e.get("iter") == fork["iter"] and field in e), None)

    if not any(compare.fork_point(r) is not None for r in runs.values()):
        return None
    out = {}
    for variant in report["variants"]:
        per_seed = {}
        for (v, seed), run in runs.items():
            base = runs.get((baseline, seed))
            if v != variant or base is None:
                continue
            mine, theirs = first(run), first(base)
            if mine is not None and theirs is not None and math.isfinite(mine) and math.isfinite(theirs):
                per_seed[f"seed{seed}"] = mine - theirs
        mean = float(np.mean(list(per_seed.values()))) if per_seed else None
        margin = report.get("min_effect")
        out[variant] = dict(per_seed=per_seed, mean=mean, margin=margin,
                            beyond_margin=bool(margin and mean is not None and abs(mean) > margin))
    return out


def add_to_report(report, runs, bridge_runs=None):
    """The loss jump at the fork (a forked design) and, where the suite declared bridge_seeds and its
    scratch runs were read (bridge_runs), the bridge; both as plain data in the report. The forked
    verdicts a bridge does not confirm, and the jumps beyond the margin, are listed in
    report['does_not_stand'] for the headline."""
    jumps = fork_jumps(report, runs)
    if jumps is not None:
        report["fork_jumps"] = jumps
    if bridge_runs:  # (scratch suite, runs): suites.read_bridge_runs
        scratch = compare.compare(*bridge_runs)
        report["bridge"] = dict(design=scratch["design"], compared_at_tokens=scratch["compared_at_tokens"],
                                seeds=sorted({s for seeds in bridge_runs[0]["variants"].values() for s in seeds}),
                                variants=bridge(report, scratch))
    stand = {}
    for name, b in (report.get("bridge") or {}).get("variants", {}).items():
        if b["status"] != CONFIRMS:
            stand.setdefault(name, []).append(f"bridge {b['status']}")
    for name, j in (jumps or {}).items():
        if j["beyond_margin"]:
            stand.setdefault(name, []).append(f"loss jump at the fork {j['mean']:+.4g} beyond the margin "
                                              f"±{j['margin']:g} (a design problem)")
    if jumps is not None or bridge_runs:
        report["does_not_stand"] = stand
    return report
