"""A suite directory: the suite file's declaration checked, suite.json frozen before the runs, the
record of runs added and looks taken (suite_record.jsonl), its runs read back, and its report.

sweep.py reads and freezes suites here; report.py and sweep.py build a suite's report here. The
numbers come from compare.py (and ablation/ladder.py across sizes), the words and plots from render.py.
"""
import difflib
import hashlib
import json
import math
import os
import re
import statistics
import time

import rundir
from ablation import bridge, compare, ladder, render, stats
from configurator import ConfigError

SUITE_KEYS = ("variants", "baseline", "seeds", "metric", "allowed")
SUITE_OPTIONS = ("nproc", "heatmap", "alpha", "min_effect", "looks", "ladder", "fork_at", "bridge_seeds",
                 "fork_cold_starts", "tuning", "analysis", "equal_flops_runs", "earlier", "stop_decided",
                 "stop_half_width")
FILE_KEYS = ("base", "overrides", "suite_dir", "sweep_dir", "slurm")  # what sweep.py reads from a suite file besides the suite


SUITE_RECORD = "suite_record.jsonl"  # beside suite.json: runs added after it, and every report (a look)


LAUNCHES = "launches.jsonl"  # sweep.py's local launcher: each process of a run, start to exit (wall seconds)


def launched_seconds(path):
    """{run name: wall seconds} from a launches.jsonl, each run's processes summed (start-up included,
    which a run's own log cannot see); a torn line is skipped."""
    seconds = {}
    for line in open(path).read().splitlines() if os.path.exists(path) else []:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        seconds[entry["run"]] = seconds.get(entry["run"], 0.0) + entry["end"] - entry["start"]
    return seconds


def check_metric(metric):
    if metric not in compare.METRICS:
        raise ValueError(f"metric={metric!r}: use one of {tuple(compare.METRICS)}")


def read_suite(namespace, name, here, known_keys):
    """A suite's declaration, checked: each mistake is one line that says what to write. A variant's
    config files are relative to the suite file's directory; known_keys: the keys a variant may set
    (train.py's)."""
    err = ConfigError
    known = (*SUITE_KEYS, *SUITE_OPTIONS, *FILE_KEYS)
    for key in namespace:  # a suite file's helpers (measure = ...) are fine; a misspelled key would be ignored
        close = difflib.get_close_matches(key, known, n=1, cutoff=0.8)
        if close and key not in known:
            raise err(f"suite {name!r} sets {key!r}, which is no suite key: did you mean {close[0]!r}? (a suite "
                      f"sets {', '.join(known)})")
    missing = [k for k in SUITE_KEYS if k not in namespace]
    if missing:
        raise err(f"suite {name!r} does not set {missing}: a suite declares {SUITE_KEYS}")
    variants, seeds = namespace["variants"], namespace["seeds"]
    if not isinstance(variants, dict) or not all(isinstance(v, dict) for v in variants.values()):
        raise err("variants must be {name: {'config': file or [files], key: value, ...}}")
    if namespace["baseline"] not in variants:
        raise err(f"baseline={namespace['baseline']!r} is not one of the variants {list(variants)}")
    if not seeds or len(set(seeds)) != len(seeds) or not all(isinstance(s, int) and not isinstance(s, bool)
                                                             and s >= 0 for s in seeds):
        raise err(f"seeds={seeds!r}: give a list of distinct integers >= 0")
    try:
        check_metric(namespace["metric"])
    except ValueError as e:
        raise err(str(e)) from None
    for variant, body in variants.items():
        if not re.fullmatch(r"[\w.+-]+", variant):
            raise err(f"variant name {variant!r}: use letters, digits, '.', '+', '-' or '_'")
        unknown = set(body) - {"config"} - set(known_keys)
        if unknown:
            raise err(f"variant {variant!r} sets unknown keys {sorted(unknown)}")
        configs = body.get("config", [])
        body["config"] = [os.path.normpath(os.path.join(here, c)) for c in ([configs] if isinstance(configs, str) else configs)]
    allowed = namespace["allowed"]
    if not (isinstance(allowed, (list, tuple)) and all(isinstance(k, str) for k in allowed)):
        raise err(f"allowed={allowed!r}: a list of the keys a variant may change, e.g. allowed = [{allowed!r}]"
                  if isinstance(allowed, str) else f"allowed={allowed!r}: a list of key names, e.g. ['ra_pattern']")
    fixed = sorted(set(namespace["allowed"]) & set(compare.MEASUREMENT_KEYS))
    if fixed:
        raise err(f"allowed names {fixed}: these define how the metric is measured and must be equal in every run")
    nproc = namespace.get("nproc", 1)
    if not isinstance(nproc, int) or nproc < 1:
        raise err(f"nproc={nproc!r}: the ranks per run, an integer >= 1")
    heatmap = list(namespace.get("heatmap", []))
    if heatmap and (len(heatmap) != 2 or not set(heatmap) <= set(namespace["allowed"])):
        raise err(f"heatmap={heatmap!r}: name two of the allowed keys (x, y)")
    alpha, min_effect, looks = namespace.get("alpha", compare.DEFAULT_ALPHA), namespace.get("min_effect"), \
        namespace.get("looks")
    if not (isinstance(alpha, float) and 0 < alpha < 1):
        raise err(f"alpha={alpha!r}: the family-wise significance level, a float in (0, 1)")
    if min_effect is not None and not (isinstance(min_effect, (int, float)) and min_effect > 0):
        raise err(f"min_effect={min_effect!r}: the smallest effect of interest in the metric's units, > 0")
    if looks is not None and not (isinstance(looks, list) and looks and all(isinstance(n, int) for n in looks)
                                  and looks == sorted(set(looks)) and looks[0] >= stats.MIN_SEEDS):
        raise err(f"looks={looks!r}: the planned seed counts of each report, increasing integers >= {stats.MIN_SEEDS}")
    try:
        sizes = check_ladder(namespace.get("ladder"), variants)
    except ValueError as e:
        raise err(str(e)) from None
    fork_at = namespace.get("fork_at")
    if fork_at is not None and not (isinstance(fork_at, int) and not isinstance(fork_at, bool) and fork_at >= 1):
        raise err(f"fork_at={fork_at!r}: the iteration at which every variant leaves its seed's baseline trunk, "
                  f"an integer >= 1 (or leave it out: every run from scratch)")
    bridge_seeds = check_bridge_seeds(namespace.get("bridge_seeds"), fork_at, sizes)
    cold = namespace.get("fork_cold_starts", [])
    if not (isinstance(cold, list) and set(cold) <= set(variants) - {namespace["baseline"]}) or (cold and fork_at is None):
        raise err(f"fork_cold_starts={cold!r}: names of variants (not the baseline) that may fork without a "
                  f"function-preserving start, in a suite with fork_at")
    tuning = read_tuning(namespace.get("tuning"), here, list(seeds) + (bridge_seeds or []))
    analysis = namespace.get("analysis")  # None: the default for a new suite, or what an existing suite.json declared
    if analysis is not None and analysis not in stats.ANALYSES:
        raise err(f"analysis={analysis!r}: the test declared before the runs, one of {stats.ANALYSES} ('blocked': the "
                  f"whole arms x seeds table, seed as block, many-to-one simultaneous intervals; 'paired': a paired "
                  f"t-test per variant, Holm)")
    equal_flops = namespace.get("equal_flops_runs")  # None (unset) reads as False, and matches an older suite.json
    if equal_flops is not None and not isinstance(equal_flops, bool) or (equal_flops and fork_at is not None):
        raise err(f"equal_flops_runs={equal_flops!r}: True or False, in a suite without fork_at (a branch continues "
                  f"its trunk's schedule, so its cosine cannot end at the baseline's FLOPs)")
    earlier = namespace.get("earlier")  # None (unset) matches an older suite.json
    if earlier is not None and not (isinstance(earlier, list) and all(isinstance(e, str) and e.strip() for e in earlier)):
        raise err(f"earlier={earlier!r}: the recipes tried on the same question before this one, each a line (e.g. "
                  f"['reports/ra_shakespeare_scratch: 1,000 steps at 3e-3, 3 seeds']); each was a look")
    stop_decided = check_stop_decided(namespace.get("stop_decided"), looks, len(seeds), analysis, sizes)
    stop_half_width = namespace.get("stop_half_width")
    if stop_half_width is not None and not (isinstance(stop_half_width, (int, float)) and not isinstance(
            stop_half_width, bool) and stop_half_width > 0 and stop_decided):
        raise err(f"stop_half_width={stop_half_width!r}: the widest simultaneous interval (half-width, the metric's "
                  f"units) at which a decided arm stops, > 0, in a suite with stop_decided = True")
    if stop_decided and equal_flops:  # a stopped arm's schedule-end runs would need a stopping rule of their own
        raise err("stop_decided and equal_flops_runs together: not supported; run the equal-FLOPs question as a "
                  "suite of its own (equal_flops_runs = True, every seed)")
    return dict(name=name, variants=variants, baseline=namespace["baseline"], seeds=list(seeds),
                metric=namespace["metric"], allowed=list(namespace["allowed"]), nproc=nproc, heatmap=heatmap,
                alpha=alpha, min_effect=min_effect, looks=looks, ladder=sizes, fork_at=fork_at,
                bridge_seeds=bridge_seeds, fork_cold_starts=list(cold), tuning=tuning, analysis=analysis,
                equal_flops_runs=equal_flops, earlier=earlier, stop_decided=stop_decided, stop_half_width=stop_half_width)


def check_stop_decided(stop, looks, seeds, analysis, ladder_sizes):
    """`stop_decided = True`: at each planned look an arm the blocked analysis decides stops (stats.py, the
    sequential blocked analysis); True, or None when the suite runs every arm on every seed."""
    if stop in (None, False):
        return None
    if stop is not True:
        raise ConfigError(f"stop_decided={stop!r}: True (a decided arm stops at a planned look) or leave it out")
    if not looks or looks[-1] != seeds:
        raise ConfigError(f"stop_decided with looks={looks!r} and {seeds} seeds: declare the looks it stops at, the "
                          f"last at the suite's seed count, e.g. looks = [3, 5, {max(seeds, 6)}]")
    if analysis == "paired" or ladder_sizes:
        raise ConfigError("stop_decided needs the blocked analysis of one family: leave analysis out (or 'blocked')"
                          + (" and run each ladder size as a suite of its own" if ladder_sizes else ""))
    return True


def check_ladder(spec, variants):
    """A suite's `ladder` (ablation/ladder.py), checked and filled in (None when the suite has none): each
    mistake is one line that says what to write."""
    if spec is None:
        return None
    err = ValueError
    if not isinstance(spec, dict) or not isinstance(spec.get("sizes"), dict) or len(spec["sizes"]) < 3:
        raise err("ladder must be dict(sizes={name: {shape keys}}, ...) with at least 3 sizes: a line through two "
                  "points has no interval")
    unknown = set(spec) - {"sizes", "reference", "tokens", "learning_rate", "alpha", "extrapolate_to", "sd", "lr_check"}
    if unknown:
        raise err(f"ladder sets unknown keys {sorted(unknown)}: use sizes, reference, tokens, learning_rate, alpha, "
                  f"extrapolate_to, sd, lr_check")
    sd, lr_check = spec.get("sd"), spec.get("lr_check")
    if sd is not None and not (isinstance(sd, float) and sd > 0):
        raise err(f"ladder sd={sd!r}: the paired-difference sd the plan assumes at every size (a pilot's), a float > 0")
    if lr_check is not None and not (isinstance(lr_check, tuple) and lr_check
                                     and all(isinstance(f, float) and f > 0 and f != 1.0 for f in lr_check)):
        raise err(f"ladder lr_check={lr_check!r}: factors of the rule's learning rate to check at the smallest and "
                  f"largest size, e.g. (0.5, 2.0)")
    shapes = dict(spec["sizes"])
    target = spec.get("extrapolate_to")
    if target is not None and not (isinstance(target, tuple) and len(target) == 2 and isinstance(target[1], dict)):
        raise err(f"ladder extrapolate_to={target!r}: give (name, {{'n_layer': ..., 'n_embd': ...}})")
    for name, shape in [*shapes.items(), *([target] if target else [])]:
        if not isinstance(shape, dict) or not {"n_layer", "n_embd"} <= set(shape) or set(shape) - set(ladder.SHAPE_KEYS):
            raise err(f"ladder size {name!r}: set n_layer and n_embd (and optionally n_head, mla_latent_dim); a size "
                      f"overlays only model-shape keys {ladder.SHAPE_KEYS}, the budget and learning rate follow the rules")
    if spec.get("reference") not in shapes:
        raise err(f"ladder reference={spec.get('reference')!r}: name the size whose shape the suite's recipe has "
                  f"(one of {list(shapes)})")
    rules = {}
    for key in ("tokens", "learning_rate"):
        base, power = spec.get(key, ("params", 0.0))
        if base not in ladder.RULE_BASES or not isinstance(power, (int, float)):
            raise err(f"ladder {key}={spec.get(key)!r}: give (base, power), base one of {ladder.RULE_BASES}, e.g. "
                      f"('params', 1.0) for tokens proportional to parameters, ('params', -1/3) for the learning rate")
        rules[key] = (base, float(power))
    alpha = spec.get("alpha", compare.DEFAULT_ALPHA)
    if not (isinstance(alpha, float) and 0 < alpha < 1):
        raise err(f"ladder alpha={alpha!r}: the level of the across-size statements, a float in (0, 1)")
    clash = {v: sorted(set(body) & set(ladder.SHAPE_KEYS + ladder.RULE_KEYS)) for v, body in variants.items()}
    clash = {v: keys for v, keys in clash.items() if keys}
    if clash:
        raise err(f"variants {clash} set keys the ladder sets at each size: leave them to the ladder")
    return dict(sizes=shapes, reference=spec["reference"], tokens=rules["tokens"],
                learning_rate=rules["learning_rate"], alpha=alpha, extrapolate_to=list(target) if target else None,
                sd=sd, lr_check=list(lr_check) if lr_check else None)


def check_ladder_recipe(spec, recipe):
    """A variant's resolved recipe against its suite's checked ladder, before ladder.size_keys scales it:
    the recipe has the reference size's shape (the rules scale from it) and no token or time limit
    (the token rule scales max_iters)."""
    reference = spec["sizes"][spec["reference"]]
    differ = {k: (recipe[k], v) for k, v in reference.items() if recipe[k] != v}
    if differ:  # the rules would scale from a recipe tuned for another shape
        raise ValueError(f"the recipe is not of the reference size {spec['reference']!r}: " + ", ".join(
            f"{k}={mine} (the size has {theirs})" for k, (mine, theirs) in differ.items())
            + ": name the size whose shape the recipe has as the ladder's reference, or fix that size")
    limits = [k for k in ("max_tokens", "max_time") if recipe[k]]
    if limits:
        raise ValueError(f"the recipe sets {', '.join(limits)}: a ladder's token rule scales max_iters; drop them")


def read_tuning(path, here, seeds):
    """`tuning`: the tuning.json tools/tune_lr.py wrote for this suite's recipe, kept in the declaration
    (so the report states it without the file): the grid, seeds, best rate and each variant's best factor."""
    if path is None:
        return None
    if not isinstance(path, str):
        raise ConfigError(f"tuning={path!r}: the path of the tuning.json tools/tune_lr.py wrote, a string such as "
                          f"'../reports/tune_<suite>/tuning.json' (the tuned rate itself goes into the recipe)")
    full = os.path.normpath(os.path.join(here, path))
    try:
        kept = tuning_facts(full)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"tuning={path!r}: not a tuning.json of tools/tune_lr.py ({type(e).__name__}: {e}); run "
                          f"python tools/tune_lr.py on the suite first") from None
    shared = sorted(set(kept["seeds"]) & set(seeds))
    if shared:
        raise ConfigError(f"tuning={path!r} was tuned on seeds {shared} that this suite compares on: the best rate "
                          f"would be chosen on the comparison's own data; tune on other seeds")
    return kept


TUNING_FREE_KEYS = ("learning_rate", "min_lr", "lr_tuning")  # what a tuning sets, or records about itself


def recipe_fingerprint(cfg):
    """The recipe a tuning ran on, but for its rate and the run's bookkeeping (seed, out_dir, W&B)."""
    kept = {k: v for k, v in cfg.items() if k not in (*TUNING_FREE_KEYS, *compare.BOOKKEEPING)
            and not k.startswith("wandb_")}
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:16]


def chosen_rate(rows, best, rule):
    """The index of the rate a tuning chooses from rows [(lr, mean, per-seed values)] ascending: the lowest
    mean (`best`) or, under 'one_se', the lowest rate whose per-seed differences from the best's have a mean
    within one standard error of 0. tools/tune_lr.py chooses with it, and a tuning.json is checked by it."""
    if rule == "lowest_mean":
        return best
    for i, (_, mean, values) in enumerate(rows):
        diffs = [v - b for v, b in zip(values, rows[best][2])]
        if i == best or (math.isfinite(mean) and statistics.mean(diffs) <= statistics.stdev(diffs) / math.sqrt(len(diffs))):
            return i


def check_tuning_record(result):
    """A tuning.json against its own grid: each row's mean is its values' mean, the best rate is the one its
    rule chooses from them, and `bracketed` is what the grid shows (a hand-edited best rate is refused)."""
    rows = [(row["lr"], row["mean"], row["values"]) for row in result["grid"]]
    if [lr for lr, _, _ in rows] != sorted(lr for lr, _, _ in rows):
        raise ValueError("its grid is not in ascending order of rate")
    for lr, mean, values in rows:
        if not math.isclose(mean, sum(values) / len(values), rel_tol=1e-9) and not (math.isinf(mean) and mean in values):
            raise ValueError(f"the mean at {lr:g} is not the mean of its values")
    best = min(range(len(rows)), key=lambda i: rows[i][1])
    chosen = rows[chosen_rate(rows, best, result.get("rule", "lowest_mean"))][0]
    if not math.isclose(result["best_lr"], chosen, rel_tol=1e-9):
        raise ValueError(f"best_lr={result['best_lr']:g} is not the best of its own grid ({chosen:g} by its rule "
                         f"{result.get('rule', 'lowest_mean')!r}): the file was edited")
    if result["bracketed"] and best in (0, len(rows) - 1):
        raise ValueError("it says bracketed, but its lowest mean is at the grid's edge")


def tuning_facts(path):
    with open(path) as f:
        result = json.load(f)
    check_tuning_record(result)
    kept = {k: result[k] for k in ("summary", "best_lr", "seeds", "bracketed", "date", "commit")}
    return dict(kept, path=rundir.in_repository(path), grid=[row["lr"] for row in result["grid"]], recipe=result.get("recipe_fingerprint"),
                best_factors={v: c["best_factor"] for v, c in result["variants"].items()})


def current_tuning(declared):
    """The declared tuning, with the variants' rate check the same tuning (same best rate and seeds)
    added to its file since (tools/tune_lr.py checks the variants after the baseline's grid)."""
    path = os.path.join(rundir.REPO_DIR, declared.get("path", "")) if declared else ""  # relative to the repository (an older one absolute)
    if not declared or not os.path.exists(path):
        return declared
    try:
        now = tuning_facts(path)
    except (OSError, ValueError, KeyError, TypeError):
        return declared
    same = now["best_lr"] == declared["best_lr"] and now["seeds"] == declared["seeds"]
    return dict(declared, best_factors=now["best_factors"], summary=now["summary"]) if same else declared


def check_tuning(tuning, baseline_cfg):
    """Before any run: the baseline trains at the rate its tuning found (else the header would claim a
    tuning the runs did not use)."""
    if tuning and not math.isclose(baseline_cfg["learning_rate"], tuning["best_lr"], rel_tol=1e-3):
        raise ConfigError(f"the baseline trains at learning_rate={baseline_cfg['learning_rate']:g} but its tuning found "
                          f"{tuning['best_lr']:.4g}: write the tuned rate into the recipe (tools/tune_lr.py --write) "
                          f"or drop `tuning` from the suite")
    # a tuning of another recipe (another budget, model or data) says nothing about this one's rate; a
    # tuning.json written before tune_lr recorded its recipe has no fingerprint to compare
    if tuning and tuning.get("recipe") and tuning["recipe"] != recipe_fingerprint(baseline_cfg):
        raise ConfigError(f"tuning={tuning['path']} was run on another recipe than this suite's baseline (only the "
                          f"rate may differ): tune this suite's recipe (python tools/tune_lr.py SUITE), or declare "
                          f"the tuning of this recipe")


def check_bridge_seeds(seeds, fork_at, sizes):
    """bridge_seeds (ablation/bridge.py): seeds on which every variant also trains from scratch, so
    that the report can say how the forked effect relates to the from-scratch one."""
    if seeds is None:
        return None
    if fork_at is None:
        raise ConfigError("bridge_seeds without fork_at: a suite from scratch needs no bridge; leave it out")
    if sizes:
        raise ConfigError("bridge_seeds on a ladder: not supported; bridge the reference size as a suite of its own")
    if not (isinstance(seeds, list) and len(seeds) >= 2 and len(set(seeds)) == len(seeds)
            and all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds)):
        raise ConfigError(f"bridge_seeds={seeds!r}: a list of at least 2 distinct integers >= 0 (each trains every "
                          f"variant from scratch; the ratio's interval needs a spread)")
    return list(seeds)


def portable_variants(variants):
    """The variants as suite.json keeps them: config files relative to the repository (nothing reads these
    paths back to run)."""
    return {v: dict(body, config=[rundir.in_repository(c) for c in body.get("config", [])]) for v, body in variants.items()}


# runs read apart from the family, never pooled with it: the point's flag -> (suite.json key, the record's event)
APART = {"bridge": ("bridge_runs", "bridge_added"), "flops": ("flops_runs", "flops_added")}


def declared_apart(declared, record, key, event):
    """{run name: [variant, seed]} of the runs kept apart under `key` in suite.json, and those the record added."""
    return dict(declared.get(key) or {}, **{k: v for e in record if e.get("event") == event for k, v in e["runs"].items()})


def freeze_suite(suite, runs, sweep_dir):
    """suite.json: the declaration as of the first run, written once and never rewritten. Its metric,
    baseline, alpha, min_effect and looks cannot change afterwards (the report must not pick the most
    flattering one); runs added later (more seeds or variants) go into the suite's record, with the
    number of looks taken before them, so a report can say the suite grew after it was looked at."""
    path = os.path.join(sweep_dir, "suite.json")
    wanted = {name: [p["variant"], p["seed"]] for name, p, _ in runs
              if not p.get("trunk") and "lr_check" not in p and not any(p.get(flag) for flag in APART)}
    apart = {flag: {name: [p["variant"], p["seed"]] for name, p, _ in runs if p.get(flag)} for flag in APART}
    first = check_declaration(suite, sweep_dir)
    if first is None:
        os.makedirs(sweep_dir, exist_ok=True)
        with rundir.atomic_write(path, "w") as f:  # a torn suite.json would lose the plan
            json.dump(dict(suite, variants=portable_variants(suite["variants"]),
                           analysis=suite.get("analysis") or stats.DEFAULT_ANALYSIS, runs=wanted,
                           **{APART[flag][0]: named for flag, named in apart.items() if named}), f, indent=1)
    else:
        record = read_suite_record(sweep_dir)
        known = suite_runs(first, record)
        added = {name: run for name, run in wanted.items() if name not in known}
        if added:
            append_suite_record(sweep_dir, dict(event="added", runs=added,
                                                         looks_before=len(compare.looks_taken(record))))
        for flag, named in apart.items():
            key, event = APART[flag]
            known_apart = declared_apart(first, record, key, event)
            if set(named) - set(known_apart):
                append_suite_record(sweep_dir, dict(event=event, runs={n: run for n, run in named.items()
                                                                       if n not in known_apart}))
        if suite.get("stop_half_width") != effective_half_width(first, record):  # narrowed: check_declaration
            append_suite_record(sweep_dir, dict(event="stop_half_width", stop_half_width=suite["stop_half_width"],
                                                looked_at=compare.looks_taken(record)))
    if suite.get("ladder"):  # each size is an ordinary suite of its own in suite_dir/<size>
        for size in suite["ladder"]["sizes"]:
            own = [(ladder.size_of(name)[1], p, argv) for name, p, argv in runs if p["size"] == size]
            freeze_suite(dict(suite, name=f"{suite['name']}/{size}", ladder=None), own, os.path.join(sweep_dir, size))


def check_declaration(suite, sweep_dir):
    """The declaration in sweep_dir/suite.json (None before the first run), checked against the suite
    file's: its metric, baseline, alpha, min_effect, looks and fork_at cannot change, and it is never
    declared again after a look; stop_half_width may only narrow, while no arm has stopped. Reads only (sweep.py asks before anything runs; freeze_suite too)."""
    path = os.path.join(sweep_dir, "suite.json")
    if not os.path.exists(path):
        looks = compare.looks_taken(read_suite_record(sweep_dir))
        if looks:  # a declaration written after a look could pick the most flattering metric
            raise ConfigError(f"{path} is missing but {os.path.join(sweep_dir, SUITE_RECORD)} holds {len(looks)} "
                              f"look(s) at the runs under the declaration it held: restore suite.json from a copy, or "
                              f"start a new suite_dir; it is never declared again after a look")
        return None
    try:
        first = read_suite_json(path)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    for key in ("metric", "baseline", "alpha", "min_effect", "looks", "fork_at", "analysis", "equal_flops_runs",
                "earlier", "stop_decided"):  # fork_at: the trunks
        if key == "analysis":  # on disk; analysis: a suite.json from before the key declared the paired analysis
            if suite.get("analysis") not in (None, declared_analysis(first)):  # unset: the frozen one stands
                raise ConfigError(
                    f"{path} declared analysis={declared_analysis(first)!r} before its runs (a suite.json without the "
                    f"key declared 'paired'); this suite says {suite['analysis']!r}: keep it, or start a new suite_dir")
            continue
        if first.get(key) != suite.get(key) and (key in first or suite.get(key) is not None):
            raise ConfigError(
                f"{path} declared {key}={first.get(key)!r} before its runs; this suite says {suite.get(key)!r}: "
                f"keep it, or start a new suite_dir")
    record = read_suite_record(sweep_dir)
    declared, wanted = effective_half_width(first, record), suite.get("stop_half_width")
    if wanted != declared:
        stopped = sorted(stopped_arms(record))
        if wanted is None or declared is not None and wanted > declared or stopped:
            raise ConfigError(f"{path} stops a decided arm at half-width {declared!r}; this suite says {wanted!r}: it "
                              f"may only narrow, and only while no arm has stopped"
                              + (f" ({', '.join(stopped)} did)" if stopped else "") + "; keep it, or start a new suite_dir")
    return first


def effective_half_width(declared, record):
    """The stop_half_width in force: the declared one, or the last narrowing the record holds (going on past a look
    never costs a repeated interval its coverage, so the rule may only narrow after the runs start)."""
    narrowed = [e["stop_half_width"] for e in record if e.get("event") == "stop_half_width"]
    return narrowed[-1] if narrowed else declared.get("stop_half_width")


def declared_analysis(declared):
    """The analysis a frozen suite.json declared: one written before the key existed declared the paired one."""
    return declared.get("analysis") or "paired"


def read_suite_record(suite_dir):
    """The suite's record, oldest first: {"event": "added", "runs", "looks_before"} and
    {"event": "look", "seeds"} lines (a torn last line is skipped)."""
    path = os.path.join(suite_dir, SUITE_RECORD)
    if not os.path.exists(path):
        return []
    entries = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                entries.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return entries


def append_suite_record(suite_dir, entry):
    """Append one line to the record; earlier lines are never rewritten."""
    with open(os.path.join(suite_dir, SUITE_RECORD), "a", encoding="utf-8") as f:
        f.write(json.dumps(dict(entry, time=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))) + "\n")


def read_suite_json(path):
    """A suite's frozen declaration; a damaged file is named in one line, never parsed half-way."""
    try:
        with open(path, encoding="utf-8") as f:
            declared = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is damaged ({e}): it holds the plan declared before the runs; restore it "
                         f"(or, if no report was built yet, delete it to declare the suite again from its file)") from None
    if not isinstance(declared, dict) or not {"metric", "baseline", "runs"} <= set(declared):
        raise ValueError(f"{path} is not a suite declaration (no metric, baseline and runs)")
    return declared


def check_suite_dir(path):
    """A directory given where one suite is expected (a pilot, a noise budget, a calibration): each
    other thing is one line that says what to give instead."""
    if not os.path.exists(path):
        raise ValueError(f"{path} does not exist: give a finished suite directory (one sweep.py wrote)")
    if not os.path.isdir(path):
        raise ValueError(f"{path} is a file, not a suite directory: give the directory sweep.py wrote")
    if not os.path.exists(os.path.join(path, "suite.json")):
        if os.path.exists(os.path.join(path, "log.jsonl")) or os.path.exists(os.path.join(path, "config.json")):
            raise ValueError(f"{path} is one run's directory, not a suite: give the suite directory that holds it")
        raise ValueError(f"{path} holds no suite.json: not a suite directory sweep.py wrote")
    declared = read_suite_json(os.path.join(path, "suite.json"))
    if declared.get("ladder"):
        sizes = list(declared["ladder"]["sizes"])
        raise ValueError(f"{path} is a ladder of {len(sizes)} sizes ({', '.join(sizes)}), each a suite of its own "
                         f"with its own noise and cost: give one size, e.g. {os.path.join(path, sizes[0])}")


def load_suite_dir(suite_dir):
    """(suite, runs) of a directory written by sweep.py: suite.json names each run's variant and seed
    as declared before the first run; the suite's record adds the runs added later and the looks.
    A ladder's top directory is refused: its sizes are suites of their own, never pooled into one."""
    check_suite_dir(suite_dir)
    declared = read_suite_json(os.path.join(suite_dir, "suite.json"))
    suite = {k: declared.get(k) for k in ("name", "metric", "baseline", "allowed", "heatmap", "alpha", "min_effect",
                                          "looks", "earlier", "stop_decided")}
    suite.update(record=read_suite_record(suite_dir), declared_seeds=declared.get("seeds"),
                 analysis=declared_analysis(declared),
                 tuning=current_tuning(declared.get("tuning")))
    suite["stop_half_width"] = effective_half_width(declared, suite["record"])
    suite["variants"], runs, suite["stopped"] = {}, {}, stopped_arms(suite["record"])
    looked = max(compare.looks_taken(suite["record"]), default=0)
    ranks = {seed: i for i, seed in enumerate(sorted({s for _, s in suite_runs(declared, suite["record"]).values()}))}
    for run_name, (variant, seed) in suite_runs(declared, suite["record"]).items():
        stop = suite["stopped"].get(variant)
        if stop and ranks[seed] >= stop["seeds"] and not os.path.exists(os.path.join(suite_dir, run_name)):
            stop["runs"].append(run_name)  # never run: its arm was decided at that look
            continue
        suite["variants"].setdefault(variant, []).append(seed)
        runs[(variant, seed)] = rundir.read_run(os.path.join(suite_dir, run_name))
        if len(suite["variants"][variant]) <= looked and not os.path.exists(os.path.join(suite_dir, run_name)):
            runs[(variant, seed)]["not_started"] = (f"missing after a look: a report at {looked} seeds read it, and "
                                                    f"its directory was deleted since: restore it")
        if declared.get("fork_at") and not runs[(variant, seed)]["events"] and not runs[(variant, seed)].get("not_started"):
            runs[(variant, seed)]["not_started"] = trunk_problem(suite_dir, seed)
    return suite, runs


def stopped_arms(record):
    """{variant: dict(look_number, seeds, runs=[])} of the arms a sequential suite's record says were decided and
    stopped at a look (load_suite_dir fills in the runs never made)."""
    return {v: dict(look_number=e["look_number"], seeds=e["seeds"], runs=[]) for e in record if e.get("event") == "look"
            for v in e.get("stopped", [])}


def take_look(suite_dir, seeds):
    """A sequential suite's look at its first `seeds` seeds (the sequential blocked analysis, compare.py), appended
    to the record once with the arms it stopped; returns every arm stopped so far, or None when the
    look could not be taken (a run failed or is missing)."""
    suite, runs = load_suite_dir(suite_dir)
    first = sorted({s for v in suite["variants"].values() for s in v})[:seeds]
    suite["variants"] = {v: [s for s in own if s in first] for v, own in suite["variants"].items()}
    report = compare.compare(suite, {(v, s): r for (v, s), r in runs.items() if s in first})
    look = next((e for e in report["blocked_analysis"].get("sequential", []) if e["seeds"] == seeds), None)
    if look is None:
        return None
    if not any(e.get("event") == "look" and e.get("seeds") == seeds and "stopped" in e for e in suite["record"]):
        append_suite_record(suite_dir, dict(event="look", seeds=seeds, look_number=look["number"], stopped=look["stopped"]))
    return set(suite["stopped"]) | set(look["stopped"])


def trunk_problem(suite_dir, seed):
    """Why a branch of a forked suite never started, from its seed's trunk ('its trunk trunk-seed1
    diverged'), or None when the trunk finished or has not run yet (the branch is simply not run)."""
    trunk = f"trunk-seed{seed}"
    state = rundir.run_status(rundir.read_events(os.path.join(suite_dir, trunk)))
    return f"its trunk {trunk} {state}" if state in ("diverged", "failed", "preempted") else None


def read_bridge_runs(suite_dir):
    """(scratch suite, runs) of the bridge in a suite directory, or None: the suite.json's
    bridge_runs plus those its record added later."""
    declared = read_suite_json(os.path.join(suite_dir, "suite.json"))
    named = declared_apart(declared, read_suite_record(suite_dir), *APART["bridge"])
    if not named:
        return None
    variants, runs = {}, {}
    for run_name, (variant, seed) in named.items():
        variants.setdefault(variant, []).append(seed)
        runs[(variant, seed)] = rundir.read_run(os.path.join(suite_dir, run_name))
    scratch_suite = dict(name=f"{declared.get('name')} (bridge: from scratch)", metric=declared["metric"],
                         baseline=declared["baseline"], allowed=declared.get("allowed") or [], variants=variants,
                         alpha=declared.get("alpha"), min_effect=declared.get("min_effect"), record=[], looks=None)
    return scratch_suite, runs


def read_flops_runs(suite_dir):
    """{(variant, seed): run} of the suite's schedule-end runs (equal_flops_runs; sweep.schedule_end_runs), each
    ending at the baseline's FLOPs: the equal-FLOPs view reads them; none when the suite did not declare them."""
    declared = read_suite_json(os.path.join(suite_dir, "suite.json"))
    named = declared_apart(declared, read_suite_record(suite_dir), *APART["flops"])
    return {(variant, seed): rundir.read_run(os.path.join(suite_dir, name)) for name, (variant, seed) in named.items()}


def suite_runs(declared, record):
    """{run name: [variant, seed]}: the declared runs, then those the record says were added."""
    added = [e["runs"] for e in record if e.get("event") == "added"]
    return {k: v for runs in (declared["runs"], *added) for k, v in runs.items()}


def suite_from_run_dirs(dirs, metric, baseline="", allowed=None, alpha=compare.DEFAULT_ALPHA, min_effect=None):
    """(suite, runs) for run directories that no suite produced: runs whose configs agree but for
    bookkeeping keys (seed, out_dir, ...) are one variant, named after their directories; the
    baseline is `baseline` (a variant or a directory) or the first directory's variant. Without
    `allowed`, every config difference counts as intended (the report says so)."""
    check_metric(metric)
    groups = {}
    for d in dirs:
        run = rundir.read_run(d)
        if run["config"] is None:
            damaged = [line for line in run["damage"] if line.startswith(os.path.join(d, "config.json"))]
            raise ValueError(f"{damaged[0] if damaged else d + ' has no config.json'}: without its config the run "
                             f"cannot be placed: restore config.json, or leave {d} out")
        key = json.dumps({k: v for k, v in run["config"].items() if k not in compare.BOOKKEEPING}, sort_keys=True)
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
        allowed = sorted({k for r in runs.values() for k in compare.config_differences(r["config"], ref, ())})
    suite = dict(name="runs " + ", ".join(variants), metric=metric, baseline=base, allowed=list(allowed),
                 variants=variants, allowed_declared=declared, alpha=alpha, min_effect=min_effect)
    return suite, runs


def load_ladder_dir(suite_dir):
    """(declared ladder, {size: (suite, runs)}) of a ladder suite directory written by sweep.py."""
    declared = read_suite_json(os.path.join(suite_dir, "suite.json"))
    sizes = {size: load_suite_dir(os.path.join(suite_dir, size)) for size in declared["ladder"]["sizes"]
             if os.path.exists(os.path.join(suite_dir, size, "suite.json"))}
    return declared, sizes


def is_ladder_dir(suite_dir):
    path = os.path.join(suite_dir, "suite.json")
    return os.path.exists(path) and bool(read_suite_json(path).get("ladder"))


def report_suite_dir(suite_dir, out_dir=None, plan=None):
    """The suite's report; `plan` (alpha, min_effect) may fill in only what the suite did not declare
    before its runs, and the report then says it was declared afterwards."""
    if is_ladder_dir(suite_dir):
        return report_ladder_dir(suite_dir, out_dir, plan)
    suite, runs = load_suite_dir(suite_dir)
    late = {k: v for k, v in (plan or {}).items() if suite.get(k) is None}
    refused = sorted(set(plan or {}) - set(late))
    if refused:
        raise ValueError(f"{suite_dir} declared {', '.join(f'{k}={suite[k]!r}' for k in refused)} before its runs: "
                         f"it cannot be changed here")
    report = compare.compare(dict(suite, **late), runs, read_flops_runs(suite_dir))
    bridge.add_to_report(report, runs, read_bridge_runs(suite_dir))  # the loss jump at a fork; the bridge to from-scratch effects
    if late:
        report["declared_after_the_runs"] = sorted(late)
    # Every report that reads a test is a look at the data: the suite's record keeps it, before the report
    # exists (a look that cannot be recorded is not shown). One whose every verdict is blocked (a crashed
    # sweep's report: incomplete runs) read no test, so it is no look.
    tested = [n for n, v in report["variants"].items() if n != report["baseline"] and v.get("p_holm") is not None]
    if report["looked_at_seeds"] and tested:
        try:
            append_suite_record(suite_dir, dict(event="look", seeds=report["looked_at_seeds"]))
        except OSError as e:
            raise rundir.RunDirError(rundir.describe_write_error(
                e, os.path.join(suite_dir, SUITE_RECORD), "no report was written, because a look the record does not "
                "keep would be hidden: make the suite directory writable (the report itself may go to --out)")) from None
    return render.write_report(report, runs, out_dir or suite_dir)


def report_ladder_dir(suite_dir, out_dir=None, plan=None):
    """A ladder suite: each size's own report (suite_dir/<size>/report.md, one family per size), then
    the across-size report (report.md, report.json, effect_vs_size.png) from ladder.across_sizes."""
    out_dir = out_dir or suite_dir
    declared, sizes = load_ladder_dir(suite_dir)
    reports = {}
    for size in sizes:
        path = report_suite_dir(os.path.join(suite_dir, size), os.path.join(out_dir, size), plan)
        with open(os.path.join(os.path.dirname(path), "report.json")) as f:
            reports[size] = json.load(f)
    goal = compare.check_metric(declared["metric"])[2]
    checked = ladder.lr_check(suite_dir, declared)  # the rule's learning rate at the ladder's ends
    across = ladder.across_sizes(declared["ladder"], reports, goal, checked)  # no trend while it fails
    reference = reports.get(declared["ladder"]["reference"])
    report = dict(suite=declared["name"], metric=declared["metric"], goal=goal, baseline=declared["baseline"],
                  allowed=declared["allowed"], designs={s: render.design_text(r).split(":")[0] for s, r in reports.items()},
                  per_size={s: dict(compared_at_tokens=r["compared_at_tokens"], alpha=r["alpha"],
                                    comparisons=r["comparisons"], report=os.path.join(s, "report.md"),
                                    learning_rate=(r.get("about") or {}).get("learning_rate"))
                            for s, r in reports.items()},
                  tuning=render.tuning_text(reference) if reference else None,
                  across_sizes=across, **({"lr_check": checked} if checked else {}))
    os.makedirs(out_dir, exist_ok=True)
    plot = render.ladder_plot(report, out_dir)
    return render.save_report(report, render.ladder_markdown(report, plot), out_dir)
