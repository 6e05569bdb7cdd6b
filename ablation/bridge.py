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
- each side's own interval at the same confidence (one level for the whole table), and the bridge's
  status from them: "confirmed" (both effects decided, same sign), "conflict" (both decided,
  opposite signs), "negligible in both" (both intervals inside ±min_effect: an equivalence of its
  own), "lost at the fork" (the forked interval inside ±min_effect, the from-scratch effect decided),
  "underpowered" (a side cannot be told from 0: the bridge then says the effect it could have
  seen, 80% power at its level, from that side's sd and seeds). Two effects indistinguishable from 0
  never "conflict". The ratio's Fieller interval uses a Welch-type (Satterthwaite) df, since the two
  sides have their own variances and seed counts. "incomplete": a forked or from-scratch run of the
  variant or of the baseline did not finish (named).
Anything but "confirmed" or "negligible in both" means the forked verdict does not stand as an answer to
"does it help?"; the report then puts the from-scratch verdict in its place (compare.answers).

The loss jump: each branch's first evaluation (at the fork point) minus its seed's baseline branch's.
A variant whose new parameters start cold (or whose architecture changes the function outright)
starts the comparison from a shock that the rest of the budget only recovers from; a mean jump
beyond the suite's min_effect is named as a design problem, not an effect.

Numbers only (report.json); ablation/render.py words them.
"""
import math
import os

import numpy as np

from ablation import compare, stats

STANDS = ("confirmed", "negligible in both")  # bridge statuses under which the forked verdict answers the question
# What a verdict's answer is quoted with (compare.answers): the from-scratch side's, where the fork does not stand
ANSWER_KEYS = ("verdict", "reasons", "n", "diff_mean", "interval", "interval_confidence", "equivalence_interval",
               "equivalence_confidence", "p_holm", "contrast")


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


def welch_df(se_a, n_a, se_b, n_b, r):
    """Satterthwaite's degrees of freedom of a - r b, each mean with its own variance and seeds."""
    va, vb = se_a ** 2, (r * se_b) ** 2
    if va + vb == 0:
        return float(min(n_a, n_b) - 1)
    return (va + vb) ** 2 / (va ** 2 / (n_a - 1) + vb ** 2 / (n_b - 1))


def side(diffs, level, min_effect):
    """One side of the bridge at confidence 1 - level: mean, se, interval (its own n - 1 df), whether
    it is decided (+1 / -1: the interval excludes 0 on that side; 0: it holds 0) and whether the
    interval lies inside ±min_effect; the sd and n for the effect it could have seen."""
    from scipy import stats as sps
    mean, se = mean_se(diffs)
    if se is None:
        return None
    half = float(sps.t.isf(level / 2, len(diffs) - 1)) * se
    lo, hi = mean - half, mean + half
    return dict(mean=mean, se=se, n=len(diffs), sd=se * math.sqrt(len(diffs)), interval=[lo, hi],
                decided=1 if lo > 0 else -1 if hi < 0 else 0,
                negligible=bool(min_effect and -min_effect < lo and hi < min_effect))


def ratio(forked_diffs, scratch_diffs, level, min_effect=None):
    """The bridge of one variant: both sides at confidence 1 - level, the ratio forked / from scratch with
    Fieller's interval (Welch-type df), and the status (module docstring)."""
    from scipy import stats as sps
    a, b = side(forked_diffs, level, min_effect), side(scratch_diffs, level, min_effect)
    out = dict(forked=a and a["mean"], forked_se=a and a["se"], scratch=b and b["mean"], scratch_se=b and b["se"],
               forked_n=len(forked_diffs), scratch_n=len(scratch_diffs), confidence=1 - level,
               forked_interval=a and a["interval"], scratch_interval=b and b["interval"], ratio=None, interval=None,
               kind=None, signs_agree=None, could_see=None, status="incomplete")
    if a is None or b is None:
        out["reasons"] = [dict(code="too_few_paired_seeds")]
        return out
    out["ratio"] = a["mean"] / b["mean"] if b["mean"] != 0 else None
    out["signs_agree"] = bool(a["mean"] * b["mean"] > 0)
    df = welch_df(a["se"], a["n"], b["se"], b["n"], out["ratio"] if out["ratio"] is not None else 1.0)
    out["df"], out["t"] = df, float(sps.t.isf(level / 2, df))
    out["kind"], out["interval"] = fieller(a["mean"], a["se"], b["mean"], b["se"], out["t"])
    at = dict(confidence=out["confidence"], forked=a["mean"], scratch=b["mean"], min_effect=min_effect)
    if a["decided"] and b["decided"]:
        out["status"] = "confirmed" if a["decided"] == b["decided"] else "conflict"
        out["reasons"] = [dict(code="both_decided", **at, same_sign=out["status"] == "confirmed")]
    elif a["negligible"] and b["negligible"]:
        out["status"] = "negligible in both"
        out["reasons"] = [dict(code="both_negligible", **at)]
    elif a["negligible"] and b["decided"]:
        out["status"] = "lost at the fork"
        out["reasons"] = [dict(code="lost_at_fork", **at)]
    else:
        weak = [(name, s) for name, s in (("from-scratch", b), ("forked", a)) if not s["decided"]]
        out["status"] = "underpowered"
        out["could_see"] = {name: stats.detectable_effect(s["sd"], s["n"], level) for name, s in weak}
        out["reasons"] = [dict(code="holds_zero", side=name, mean=s["mean"], n=s["n"], confidence=out["confidence"],
                               could_see=out["could_see"][name]) for name, s in weak]
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
        entry = ratio(v.get("differences") or [], (s or {}).get("differences") or [], report["level"],
                      report.get("min_effect"))
        entry.update(forked_verdict=v.get("verdict"), scratch_verdict=(s or {}).get("verdict", "no runs"),
                     scratch_answer={k: (s or {}).get(k) for k in ANSWER_KEYS}, forked_per_seed=dict(zip(map(str, v.get("paired_seeds") or []),
                                                                      v.get("differences") or [])),
                     scratch_per_seed=dict(zip(map(str, (s or {}).get("paired_seeds") or []),
                                               (s or {}).get("differences") or [])))
        unfinished = unfinished_runs(v, report["variants"].get(report["baseline"]), s,
                                     scratch["variants"].get(scratch.get("baseline")))
        if unfinished:  # the seeds that finished may disagree in sign where all of them would not
            entry.update(status="incomplete", reasons=[dict(code="not_finished", runs=unfinished)])
        out[name] = entry
    return out


def unfinished_runs(*entries):
    """[dict(run='scratch-gated-seed2', status='diverged'), ...]: the runs of these compare entries (a
    variant's forked or from-scratch runs, or their baselines') that did not finish, by directory."""
    return [dict(run=os.path.basename(os.path.normpath(r["out_dir"])), status=r["status"]) for e in entries
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
    report['does_not_stand'] for the headline: {variant: [reason dicts, code "bridge" or "fork_jump"]}."""
    jumps = fork_jumps(report, runs)
    if jumps is not None:
        report["fork_jumps"] = jumps
    if bridge_runs:  # (scratch suite, runs): suites.read_bridge_runs
        scratch = compare.compare(*bridge_runs)
        report["bridge"] = dict(design_code=scratch["design_code"], fork_at=scratch["fork_at"],
                                compared_at_tokens=scratch["compared_at_tokens"],
                                seeds=sorted({s for seeds in bridge_runs[0]["variants"].values() for s in seeds}),
                                variants=bridge(report, scratch))
    stand = {}
    for name, b in (report.get("bridge") or {}).get("variants", {}).items():
        if b["status"] not in STANDS:
            stand.setdefault(name, []).append(dict(code="bridge", status=b["status"]))
    for name, j in (jumps or {}).items():
        if j["beyond_margin"]:
            stand.setdefault(name, []).append(dict(code="fork_jump", mean=j["mean"], margin=j["margin"]))
    if jumps is not None or bridge_runs:
        report["does_not_stand"] = stand
    report["answers"] = answers(report)
    return report


def answers(report):
    """{variant: the answer that stands}: its own verdict where the design answers "does it help?"
    (from scratch, or a fork that stands), else the bridge's from-scratch verdict in its place (with
    the forked one and why it does not stand: replaces.reasons), else no answer. The headline, the
    table's verdict column and the why-lines all quote this."""
    stand, bridged = report.get("does_not_stand") or {}, (report.get("bridge") or {}).get("variants", {})
    source = "forked" if report.get("fork_at") is not None else "from_scratch"  # render.ANSWER_SOURCES words it
    out = {}
    for name, v in report["variants"].items():
        if name == report["baseline"]:
            continue
        own = {k: v.get(k) for k in ANSWER_KEYS}
        if name not in stand:
            out[name] = dict(own, source=source, replaces=None)
        elif name in bridged and bridged[name]["scratch_answer"].get("verdict"):
            out[name] = dict(bridged[name]["scratch_answer"], source="bridge",
                             replaces=dict(verdict=v.get("verdict"), source=source, reasons=stand[name]))
        else:
            out[name] = dict({k: None for k in ANSWER_KEYS}, verdict="no answer", source=source,
                             reasons=[dict(code="no_answer")],
                             replaces=dict(verdict=v.get("verdict"), source=source, reasons=stand[name]))
    return out
