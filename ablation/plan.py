"""The seed planner before a suite runs (sweep.py --plan): from a finished pilot suite per design,
the paired-difference sd, the wall time a seed costs, and the seeds and minutes that min_effect or a
wall-clock budget come to.
"""
import os

import numpy as np

import rundir
from ablation import compare, ladder, render, stats, suites

def seed_plan_text(suite, n_runs, pilots, budget_s=None, slots=1, own_dir=None):
    """sweep.py --plan: the planner's answer for this suite before anything runs, from pilots
    (finished suites, one per design; by default this suite's own finished runs): for each design
    its paired-difference sd, the wall time a seed costs, and the seeds and minutes that min_effect
    and a wall-clock budget come to with `slots` runs at a time."""
    k, alpha, min_effect = len(suite["variants"]) - 1, suite["alpha"], suite["min_effect"]
    lines = [f"suite {suite['name']}: {len(suite['variants'])} variants x {len(suite['seeds'])} seeds = {n_runs} runs, "
             f"{k} comparison(s) against {suite['baseline']!r}, family-wise alpha {alpha:g}, min_effect "
             + (f"{min_effect:g}" if min_effect else "not declared (warning: equivalence cannot be shown)")
             + f", {slots} run(s) at a time"]
    bridge = len(suite.get("bridge_seeds") or []) * len(suite["variants"])
    if bridge:  # ablation/bridge.py: every variant from scratch on the bridge seeds, the whole budget each
        lines.append(f"bridge: {bridge} runs from scratch ({len(suite['variants'])} variants x bridge_seeds "
                     f"{suite['bridge_seeds']}), each the whole budget (a trunk's and a branch's length), included in "
                     f"the {n_runs} runs")
    if suite.get("ladder"):  # the slope the ladder can detect, its extrapolation bound (ablation/ladder.py)
        lines += render.ladder_plan_lines(ladder.plan(suite["ladder"], len(suite["seeds"]), k))
    for pilot_dir in pilots:
        lines += pilot_plan_lines(suite, pilot_dir, budget_s, slots, own_dir)
    return "\n".join(lines)


BUDGETS_S = (900, 1800, 3600, 7200)  # the budgets --plan prints without --budget


def pilot_runs(suite, pilot_dir):
    """(label, pilot suite, runs): the pilot's paired runs of this suite's design where it holds them. A
    forked suite's bridge (its variants from scratch, ablation/bridge.py) pilots a suite from scratch;
    otherwise the pilot's own runs, whose design the plan names."""
    bridge = suites.read_bridge_runs(pilot_dir)
    if bridge and not suite.get("fork_at"):
        return f"{pilot_dir}'s bridge", *bridge
    return (pilot_dir, *suites.load_suite_dir(pilot_dir))


def pilot_plan_lines(suite, pilot_dir, budget_s, slots, own_dir=None):
    alpha, min_effect = suite["alpha"], suite["min_effect"]
    if not (pilot_dir and os.path.exists(os.path.join(pilot_dir, "suite.json"))):
        return ["no pilot: pass --pilot=SUITE_DIR (a finished suite; several, comma-separated, compare designs) "
                "for the detectable effect, the seeds needed and the time"]
    label, pilot, runs = pilot_runs(suite, pilot_dir)
    analysis = suite.get("analysis") or stats.DEFAULT_ANALYSIS
    report = compare.compare(dict(pilot, alpha=alpha, min_effect=min_effect, record=[], looks=None,
                                  analysis=analysis), runs)
    lines = [f"from pilot {label} ({render.design_text(report)}):"]
    plan, detect, needed = planned(report, suite, alpha, min_effect)
    if plan is None:
        return lines + [f"  no variant of this suite has two paired seeds in the pilot (its arms: "
                        f"{', '.join(pilot['variants'])}; this suite's: {', '.join(suite['variants'])}), so no sd to "
                        f"plan from"]
    lines.append(render.describe_plan(plan))
    pilot_seeds = sorted({s for seeds in pilot["variants"].values() for s in seeds})
    own = own_dir is not None and os.path.realpath(pilot_dir) == os.path.realpath(own_dir)
    first = 1 if own else max(pilot_seeds, default=0) + 1  # another suite's pilot: seeds after its own
    overlap = sorted(set(pilot_seeds) & set(suite["seeds"]))
    if overlap and not own:
        lines.append(f"  warning: the pilot ran seeds {overlap}, which are also this suite's: their runs would be the "
                     f"pilot's own, bit for bit, so the suite's report would not be its first look at them. Use seeds "
                     f"from {first} on (disjoint), or count the pilot as a look (declare looks)")
    cost = seed_cost(pilot_dir, runs, len(suite["variants"]))
    if cost is None:
        return lines + ["  no finished run in the pilot to time a seed by"]
    per_seed, run_s, trunk_s = cost
    minutes = lambda n: n * per_seed / slots / 60
    lines.append(f"  wall time per seed: {per_seed:.0f} s ({len(suite['variants'])} runs of median {run_s:.0f} s"
                 + (f" + its trunk, {trunk_s:.0f} s" if trunk_s else "") + f", as timed in the pilot); "
                 f"{len(suite['seeds'])} seeds take about {minutes(len(suite['seeds'])):.0f} min")
    if suite.get("bridge_seeds"):  # a from-scratch run is about a trunk plus a branch
        bridge_s = len(suite["bridge_seeds"]) * len(suite["variants"]) * (run_s + trunk_s)
        lines.append(f"  the bridge adds about {bridge_s / slots / 60:.0f} min ({len(suite['bridge_seeds'])} seeds x "
                     f"{len(suite['variants'])} runs of about {run_s + trunk_s:.0f} s)")
    if min_effect:
        for label, bound in (("at the sd", False), ("at its upper bound", True)):
            n = needed(bound)
            lines.append(f"  min_effect {min_effect:g} {label}: " + (f"{n} seeds, about {minutes(n):.0f} min"
                                                                    if n else "out of reach"))
    for budget in [budget_s] if budget_s else BUDGETS_S:
        n = int(budget * slots // per_seed)
        found = detect(n, False)  # the noisiest planned variant's
        lines.append(f"  budget {budget / 60:.0f} min: {n} seeds" + (
            f" (about {minutes(n):.0f} min) detect {found:.3g} ({detect(n, True):.3g} "
            f"at the sd's upper bound)" if found else ": too few to detect anything"))
    if budget_s:
        n = int(budget_s * slots // per_seed)
        lines.append(f"  so: seeds = list(range({first}, {first + n})) in the suite file"
                     + ("" if own else " (disjoint from the pilot's)") + ", declared before its runs" if n >= 2 else
                     f"  so: {budget_s:g} s fits {n} seed(s), fewer than the 2 a paired test needs: raise --budget")
        if suite.get("stop_decided"):
            lines.append(looks_in_budget(suite["looks"], n))
    return lines


def looks_in_budget(looks, seeds):
    """Where a budget of `seeds` seeds of every arm ends among a stop_decided suite's looks (no arm stopping: the
    worst case; each arm stopped earlier leaves its seeds to the open arms and the baseline)."""
    reached = [n for n in looks if n <= seeds]
    if not reached:
        return f"  looks {looks}: the budget ends before the first look ({looks[0]} seeds): raise --budget"
    return (f"  looks {looks}: the budget ends after look {len(reached)} ({reached[-1]} seeds) if no arm stops"
            + ("" if reached[-1] == looks[-1] else f"; the last look needs {looks[-1]} seeds of the arms still open"))


def planned(report, suite, alpha, min_effect):
    """(plan, detect(n, at_bound), needed(at_bound)) from a pilot's report for this suite's declared analysis:
    the paired analysis plans each variant on its own n - 1 df at Holm's alpha / k; the blocked analysis plans
    with its own df and simultaneous critical value from the pilot's per-arm sds (stats.plan_blocked)."""
    k = len(suite["variants"]) - 1
    if report.get("analysis") == "blocked":
        found = report.get("blocked_analysis") or {}
        keep = [i for i, v in enumerate(found.get("variants", [])) if v in suite["variants"]]
        sds = found.get("arm_sds") or []
        if not keep or len(sds) < 2:
            return None, None, None
        arms, names = [sds[0]] + [sds[i + 1] for i in keep], [found["variants"][i] for i in keep]
        plan = stats.plan_blocked(arms, names, len(found["seeds"]), len(suite["seeds"]), alpha, min_effect)
        if plan is None:
            return None, None, None
        plan["unplanned"] = sorted(set(suite["variants"]) - {suite["baseline"], *names})
        bounds = [stats.sd_upper_bound(sd, len(found["seeds"]) - 1) for sd in arms]
        pick = lambda bound: bounds if bound else arms
        detect = lambda n, bound: max(stats.blocked_detectable(pick(bound), n, alpha)) if n >= 2 else None
        needed = lambda bound: stats.blocked_seeds_needed(pick(bound), min_effect, alpha)
        return plan, detect, needed
    measured = compare.difference_sds(report)
    parts = {v: measured.get(v) for v in suite["variants"] if v != suite["baseline"]}
    plan = stats.plan_variants(parts, len(suite["seeds"]), k, alpha, min_effect)
    if plan is None:
        return None, None, None
    level = plan["level"]
    detect = lambda n, bound: stats.detectable_effect(plan["sd_upper"] if bound else plan["sd"], n, level)
    needed = lambda bound: stats.seeds_needed(plan["sd_upper"] if bound else plan["sd"], min_effect, level)
    return plan, detect, needed


def ladder_plan_text(suite, n_runs, ladder_dir, budget_s=None, slots=1):
    """sweep.py --plan for a ladder: each size is a family of its own, with its own paired sd and
    its own cost (its pilot: ladder_dir/<size>); a seed runs at every size, so a budget is divided
    by the sum of the sizes' costs, and each size detects what its own sd allows at that seed count."""
    sizes, k = list(suite["ladder"]["sizes"]), len(suite["variants"]) - 1
    level = stats.family_level(suite["alpha"], k)
    lines = [seed_plan_text(suite, n_runs, [], slots=slots) + f"; a ladder of {len(sizes)} sizes, each its own family"]
    found = {}
    for size in sizes:
        pilot_dir = os.path.join(ladder_dir, size)
        if not os.path.exists(os.path.join(pilot_dir, "suite.json")):
            lines.append(f"  size {size}: no runs yet in {pilot_dir}")
            continue
        pilot, runs = suites.load_suite_dir(pilot_dir)
        report = compare.compare(dict(pilot, alpha=suite["alpha"], min_effect=suite["min_effect"], record=[],
                                      looks=None), runs)
        planned = stats.plan_variants(compare.difference_sds(report), 2, k, suite["alpha"], suite["min_effect"])
        sd = planned["sd"] if planned else None  # the noisiest planned variant's: the plan covers it
        cost = seed_cost(pilot_dir, runs, len(suite["variants"]))
        found[size] = (sd, cost[0] if cost else None)
        lines.append(f"  size {size}: paired-difference sd " + (f"{sd:.3g}" if sd else "not yet (two paired seeds "
                     "needed)") + ", wall time per seed " + (f"{cost[0]:.0f} s" if cost else "not yet (no finished run)"))
    if len(found) < len(sizes) or not all(sd and cost for sd, cost in found.values()):
        return "\n".join(lines + ["  the plan across sizes needs every size's sd and time: run a pilot of 2 seeds "
                                   "(--seeds=1,2) to its end first"])
    per_seed = sum(cost for _, cost in found.values())
    lines.append(f"  a seed at every size: {per_seed:.0f} s of wall time, {slots} run(s) at a time")
    for budget in [budget_s] if budget_s else BUDGETS_S:
        n = int(budget * slots // per_seed)
        lines.append(f"  budget {budget / 60:.0f} min: {n} seeds" + (": detect " + ", ".join(
            f"{stats.detectable_effect(sd, n, level):.3g} at {size}" for size, (sd, _) in found.items())
            if n >= 2 else ": too few for a paired test (at least 2)"))
    return "\n".join(lines)


def timed_by_own_runs(suite_dir):
    """Whether the suite's own directory holds a finished run that --plan times a seed by (seed_cost),
    so that no measured step is needed."""
    if not os.path.exists(os.path.join(suite_dir, "suite.json")):
        return False
    _, runs = suites.load_suite_dir(suite_dir)
    return seed_cost(suite_dir, runs, 1) is not None


def seed_cost(pilot_dir, runs, n_variants):
    """(wall seconds per seed, median run, median trunk) from a pilot's finished runs: each run's
    processes from start to exit as the local launcher timed them (else from its first logged event
    to its last: start-up not counted), a seed as n_variants runs and, when the runs are forked, the
    trunk they share. None without a finished run."""
    launched = {}
    here = os.path.normpath(pilot_dir)  # a ladder's size: its runs are '<size>/<run>' in the ladder's launch log
    for path, prefix in ((os.path.join(here, suites.LAUNCHES), ""),
                         (os.path.join(os.path.dirname(here), suites.LAUNCHES), os.path.basename(here) + "/")):
        for run, seconds in suites.launched_seconds(path).items():
            if run.startswith(prefix) and (prefix or "/" not in run):
                launched[run[len(prefix):]] = launched.get(run[len(prefix):], 0.0) + seconds

    def wall(name, events):
        return launched[name] if name in launched else events[-1]["time"] - events[0]["time"]

    done = [wall(os.path.basename(os.path.normpath(r["out_dir"])), r["events"]) for r in runs.values()
            if rundir.run_status(r["events"]) == "finished"]
    if not done:
        return None
    forked = any(compare.fork_point(r) is not None for r in runs.values())  # a bridge's runs have no trunk
    trunks = [wall(d, events) for d, events in ((d, rundir.read_events(os.path.join(pilot_dir, d)))
                                                for d in os.listdir(pilot_dir) if forked and d.startswith("trunk-seed"))
              if rundir.run_status(events) == "finished"]
    run_s, trunk_s = float(np.median(done)), float(np.median(trunks)) if trunks else 0.0
    return n_variants * run_s + trunk_s, run_s, trunk_s
