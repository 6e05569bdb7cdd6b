"""Render a comparison (ablation/compare.py's report.json data) for people: report.md and its PNG plots.

The numbers come from ablation.compare and ablation/stats.py; this module only words and draws them, so each
reads alone and the numbers can be tested without the markdown. Used by sweep.py (the report after
a suite, the seed plan before it) and report.py (the report rebuilt from run directories alone).
"""
import json
import math
import os
import re
import warnings

import numpy as np

from ablation import compare, ladder, lm_eval_results, stats
from ablation.compare import UNITS, metric_by_tokens


def p_is(p):
    """'= p', or where p is 0 '< 1/draws': the blocked analysis reads its p off stats.MAX_T_DRAWS draws of the
    largest |t|, and none beyond the observed |t| bounds p by the draws' resolution, never makes it 0."""
    return f"< {1 / stats.MAX_T_DRAWS:.1g}" if p == 0 else f"= {p:.3g}"


def p_cell(p):
    return p_is(p).removeprefix("= ") if p is not None else "-"


def adjusted_p_column(report):
    """The verdict table's column for the p that decides: the blocked analysis's single-step simultaneous p,
    or the paired analysis's Holm-adjusted one."""
    return "p (simultaneous)" if report.get("analysis") == "blocked" else "p (Holm)"


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
    return save_report(report, markdown(report, plots), out_dir)


def save_report(report, text, out_dir):
    """report.json (strict JSON: the data, with the words added for readers, with_words) and report.md in
    out_dir; the path of report.md."""
    with open(os.path.join(out_dir, "report.json"), "w") as f:
        json.dump(with_words(report), f, indent=1, allow_nan=False, default=str)
    with open(os.path.join(out_dir, "report.md"), "w") as f:
        f.write(text)
    return os.path.join(out_dir, "report.md")


def interval_cell(v):
    """The interval(s) a verdict rests on, each with its confidence and what it is: the Holm step's
    interval for a decision about 0 (not simultaneous), the family's simultaneous 1 - alpha/k interval
    for every claim about the margin (equivalent, negligible, beyond it)."""
    if v.get("contrast") and v.get("interval"):  # the blocked analysis: one simultaneous interval decides everything
        return f"{span(v['interval'])} {pct(v['interval_confidence'])} simultaneous"
    holm = f"{span(v['interval'])} {pct(v['interval_confidence'])} Holm step" if v.get("interval") else None
    margin = (f"{span(v['equivalence_interval'])} {pct(v['equivalence_confidence'])} simultaneous"
              if v.get("equivalence_interval") else None)
    if v.get("verdict") == "equivalent":
        return margin
    if v.get("verdict", "").startswith(("better", "worse")) and margin:
        if v["interval"] == v["equivalence_interval"]:  # Holm's first step tests at alpha/k: the same interval
            return f"{span(v['interval'])} {pct(v['interval_confidence'])} Holm step = simultaneous"
        return f"{holm}; {margin}"
    return holm or "-"


def design_label(report):
    """The design in a few words, for every verdict line, caption and plot title: a forked suite and
    a from-scratch one answer different questions (compare.design says which)."""
    return f"forked at step {report['fork_at']}" if report.get("fork_at") is not None else "from scratch"


def margin_question(report):
    """What ±min_effect means for this report's design: a forked suite's effects are those of switching
    after the trunk, smaller than the same variant's from-scratch effect where it matters."""
    if not report.get("min_effect"):
        return ""
    if report.get("fork_at") is None:
        return (" The margin is about the from-scratch question: the effect of training the whole budget with "
                "the variant.")
    return (f" The margin is about the forked question (switching to the variant after step {report['fork_at']}), "
            f"not the from-scratch one: a forked effect can be a fraction of the same variant's from-scratch effect "
            f"(docs/ablation.md measures the shrinkage on the RA twin), so 'equivalent within ±{report['min_effect']:g}' "
            f"here is a weaker statement on the from-scratch scale, and a margin taken from a from-scratch suite "
            f"should be read at that shrinkage.")


def tuned_rate(line):
    """The best rate a recipe's lr_tuning line (tools/tune_lr.py's summary) names, or None."""
    found = re.search(r"\bbest (\d[\d.e+-]*) \(", line or "")
    try:
        return float(found.group(1)) if found else None
    except ValueError:
        return None


def is_tuned(report):
    """The baseline trains at the rate its tuning found: a recipe's lr_tuning line names its best rate, and a
    run at another rate (--learning_rate=0.003 over a recipe tuned to 0.01) is untuned."""
    a = report.get("about") or {}
    if report.get("tuning"):
        return True  # sweep.py checked that the baseline trains at the suite's tuned rate (suites.check_tuning)
    best, lr = tuned_rate(a.get("lr_tuning")), a.get("learning_rate")
    return bool(a.get("lr_tuning")) and (best is None or lr is None or math.isclose(float(f"{lr:.3g}"), best, rel_tol=1e-3))


def tuning_text(report):
    """How the recipe's learning rate was chosen: the suite's tuning, else the runs' lr_tuning, else UNTUNED."""
    a, tuning = report.get("about") or {}, report.get("tuning")
    if tuning:
        return tuning["summary"]
    if a.get("lr_tuning") and not is_tuned(report):
        return (f"**untuned**: the recipe's tuning found {fmt(tuned_rate(a['lr_tuning']))}, but these runs train at "
                f"{fmt(a.get('learning_rate'))} (its tuning: {a['lr_tuning']})")
    if a.get("lr_tuning"):
        return a["lr_tuning"]
    return ("**untuned**: no tuning is recorded for this learning rate (tools/tune_lr.py tunes a suite's recipe); "
            "a baseline off its best rate can make any variant look better or worse")


def about_lines(report):
    """What the report is about, in its first lines: model, data, budget, rate and its tuning, design,
    and how far the answer may carry."""
    a = report.get("about")
    if not a:
        return []
    size = f"{a['parameters'] / 1e6:.3g}M parameters" if a.get("parameters") else "parameters not recorded"
    shape = f"{a['n_layer']} layers x {a['n_embd']} wide, {a['n_head']} heads" if a.get("n_layer") else ""
    rate = f"learning rate {fmt(a.get('learning_rate'))} (min_lr {fmt(a.get('min_lr'))})"
    return [f"About: a `{a.get('model_type') or 'gpt'}` model of {size} ({shape}, context {a.get('block_size')}, "
            f"vocabulary {a.get('vocab_size')}) on `{a.get('dataset')}`, {a.get('max_iters')} steps, compared at "
            f"{thousands(a.get('tokens'))} training tokens, {design_label(report)}; {rate}, {tuning_text(report)}.", ""]


def carry_text(report):
    a = report.get("about") or {}
    small = a.get("parameters") is not None and a["parameters"] < 50e6
    return ((f"this is a {a['parameters'] / 1e6:.2g}M-parameter model trained for {thousands(a.get('tokens'))} "
             f"tokens; its answers hold for this recipe and speak for GPT-2 124M only as far as the transfer evidence "
             f"does (docs/transfer.md: the ladder across sizes, the published results)") if small else
            "the answers hold for this model size, data and budget; other sizes and longer training need their own "
            "runs or a ladder")


def header_lines(report):
    metric, tokens = report["metric"], report["compared_at_tokens"]
    better = "lower" if report["goal"] == "lower" else "higher"
    finals = list(filter(None, report["final_tokens"].values()))
    return [f"# Ablation report: {report['suite']} ({design_label(report)})", "", *about_lines(report),
            f"Design: {design_text(report)}",
            f"Deciding metric (declared before the runs): **{metric}** ({better} is better), compared at "
            f"**{fmt(tokens)} tokens**, the largest token count at which every finished run was evaluated "
            f"(final token counts: {fmt(min(finals, default=None))} to {fmt(max(finals, default=None))}).",
            f"Paired differences are variant minus baseline (`{report['baseline']}`) on the same seed. "
            + analysis_text(report) +
            "Smallest effect of interest (min_effect): "
            + (f"**±{report['min_effect']:g}** {UNITS.get(metric, '')}: a decided difference inside it is "
               f"reported as negligible." + margin_question(report) if report["min_effect"] else
               "**not declared** (warning: equivalence cannot be shown; declare min_effect in the suite or "
               "pass --min_effect to report.py).")
            + f" Keys allowed to differ: {', '.join(report['allowed']) or 'none'}"
            + ("." if report["allowed_declared"] else " (no suite declared them: every config difference "
                                                      "between these runs is treated as intended)."),
            f"Looks: {sequential_text(report['look'])}.", *earlier_lines(report)]


def earlier_lines(report):
    """The recipes tried on the same question before this suite (its `earlier`): each was a look at it."""
    earlier = report.get("earlier_recipes") or []
    if not earlier:
        return []
    return [f"Earlier recipes on the same question: {len(earlier)} ({'; '.join(earlier)}). Each was a look at the "
            f"question (a recipe changed after seeing results is one too): this report is look {len(earlier) + 1} "
            f"at it, and its alpha is not corrected for the earlier ones."]


def analysis_text(report):
    """The analysis the suite declared before its runs (compare: report['analysis']), with its df."""
    if report.get("stop_decided_at"):
        return sequential_analysis_text(report)
    if report.get("analysis") == "blocked":
        b = report.get("blocked_analysis") or {}
        df = (f" (simultaneous critical |t| {b['critical']:.3g}: the larger of a parametric bootstrap's at the fitted "
              f"variances and the multivariate t's on {b['family_df']:.3g} df, the least Welch-Satterthwaite df of the "
              f"contrasts)" if b.get("family_df") else "")
        return (f"Analysis (declared before the runs): **blocked**, the whole arms x seeds table with the seed as block, "
                f"over the {len(b.get('seeds', []))} seed(s) complete in every tested arm ({', '.join(map(str, b.get('seeds', [])))}); "
                f"**{report['comparisons']} many-to-one comparison(s)** against the baseline at family-wise alpha "
                f"{report['alpha']:.3g}: each variant's variance and the baseline's estimated on their own from the "
                f"block-adjusted residuals (the level holds when arms differ in noise), the contrasts' correlation through "
                f"the shared baseline in the largest |t|{df}. The {adjusted_p_column(report)} column holds the "
                f"single-step simultaneous p, the p column the paired t-test's raw p (evidence); one simultaneous {pct(1 - report['alpha'])} "
                f"interval per variant decides about 0 and about the margin (equivalence: it lies inside ±min_effect). ")
    return (f"Analysis (declared before the runs): **paired**, **{report['comparisons']} comparison(s), Holm** at "
            f"family-wise alpha {report['alpha']:.3g}, each paired t-test on its own n - 1 df: the p column "
            f"is each paired t-test's raw p, p (Holm) the adjusted one that decides; each better/worse interval is at "
            f"the level its Holm step tested (so it excludes 0 exactly when the verdict is better or worse; these "
            f"step-level intervals are not simultaneous), and every claim about the margin (equivalent, negligible, "
            f"beyond ±min_effect) rests on the simultaneous interval at 1 - alpha/k "
            f"({pct(1 - report['level'])}, Bonferroni: all {report['comparisons']} cover together with "
            f"probability >= {pct(1 - report['alpha'])}; TOST at alpha/2k per side). ")


def markdown(report, plots):
    head = header_lines(report)
    lines = head[:1] + headline(report) + head[1:] + [
        "", f"Verdicts ({design_label(report)}):" + (" the answer that stands (where a forked verdict does not, the "
                                                  "from-scratch one in its place)" if report.get("answers") else ""), "",
        f"| variant | verdict | seeds | mean | sd | diff vs baseline | interval (confidence) | p | "
        f"{adjusted_p_column(report)} |",
        "|" + "---|" * 9]
    for name, v in report["variants"].items():
        a = answer_of(report, name) if name != report["baseline"] else None
        if a and a.get("replaces"):  # the row quotes the answer in its place, as the verdict column does
            cells = [str(a["n"]), "-", "-", fmt(a["diff_mean"]), interval_cell(a), "-", p_cell(a["p_holm"])]
        else:
            cells = [str(v["n"]), fmt(v["mean"]), fmt(v["sd"]), fmt(v.get("diff_mean")) if a else "-",
                     interval_cell(v) if a else "-", fmt(v.get("p_value"), 3), p_cell(v.get("p_holm"))]
        lines.append(" | ".join([f"| {name}", verdict_cell(report, name, v), *cells]) + " |")
    if report.get("declared_after_the_runs"):
        lines.append(f"\nNote: {', '.join(report['declared_after_the_runs'])} declared after the runs (report.py), "
                     f"not before them.")
    lines.append(f"\nBaseline seed-to-seed sd: {fmt(report['baseline_sd'])} (a property of single runs; each "
                 f"paired difference is judged against its own standard error).")
    if report["non_finite"]:
        lines += ["", "## Metric not finite: COMPARISON INCOMPLETE", ""] + [
            f"- {non_finite_text(m)} (the run counts as missing; its comparisons are incomplete)"
            for m in report["non_finite"]]
    if report["measurement_problems"]:
        lines += ["", "## Measurement (must agree in every run): NOT COMPARABLE", ""] + [
            f"- {measurement_text(m)}" for m in report["measurement_problems"]]
    if report["damaged"]:
        lines += ["", "## Damaged files (and what was done about them)", ""] + [f"- {d}" for d in report["damaged"]]
    if report.get("plan"):
        lines += ["", "## Seed plan", "", "```", describe_plan(report["plan"]), "```"]
    lines += ["", f"## Why each verdict ({design_label(report)})", ""]
    lines += [why_line(report, name, v) for name, v in report["variants"].items()]
    pairing = [f"- {name}: {'; '.join(map(pairing_text, v['pairing']))}" for name, v in report["variants"].items()
               if "pairing" in v]
    if pairing:
        lines += ["", "## Pairing (same seed = same data order and initial shared weights)", "", *pairing]
    lines += transfer_lines(report) + evidence_lines(report) + compute_matched_lines(report) + cost_lines(report) + hellaswag_lines(report)
    lines += lm_eval_results.report_lines(report)
    lines += ["", "## Runs", "", *code_lines(report), "| variant | seed | status | value at compared point | final tokens | "
              "out_dir |", "|---|---|---|---|---|---|"]
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


def sign_flip_cell(signs):
    if signs["p"] is None:
        return "-"
    if "resamples" in signs:
        return f"{signs['p']:.3g} ± {signs['monte_carlo_error']:.1g} ({signs['resamples']:,} random patterns)"
    return f"{signs['p']:.3g}"


def evidence_lines(report):
    """Per seed: the paired differences, their signs and the sign-flip p next to the t-test's."""
    compared = [(n, v) for n, v in report["variants"].items() if v.get("signs")]
    if not compared:
        return []
    seeds = sorted({s for _, v in compared for s in v["paired_seeds"]})
    shown = seeds if len(seeds) <= 8 else []  # beyond 8 seeds the row would not fit: signs and p only
    level = report["level"]
    lines = ["", "## The evidence per seed", "",
             f"Each paired difference (variant - baseline, same seed); the signs (below / above 0) and the sign-flip p "
             f"(all 2^n sign patterns up to {stats.EXACT_SIGN_FLIP_SEEDS} seeds, else {stats.SIGN_FLIP_RESAMPLES:,} "
             f"random ones from a fixed seed, with their error) need no normality, the t-test's p does.",
             "", "| variant | " + "".join(f"seed {s} | " for s in shown) + "below / above 0 | sign-flip p | t-test p |",
             "|" + "---|" * (len(shown) + 4)]
    for name, v in compared:
        by_seed = dict(zip(v["paired_seeds"], v["differences"]))
        signs = v["signs"]
        lines.append(f"| {name} | " + "".join(f"{signed(by_seed.get(s))} | " for s in shown) +
                     f"{signs['below']} / {signs['above']} | {sign_flip_cell(signs)} | {fmt(v.get('p_value'), 3)} |")
    smallest = stats.smallest_sign_flip_p(min(len(v["differences"]) for _, v in compared) or 1)
    if compared[0][1]["differences"] and smallest > level:
        lines += ["", f"With these seeds the sign-flip test cannot go below {smallest:.3g}, above the family's level "
                      f"{level:.3g}: every verdict here rests on the t-test's normality assumption."]
    return lines


def compute_matched_lines(report):
    matched = [(n, v["compute_matched"]) for n, v in report["variants"].items() if v.get("compute_matched")]
    if not matched:
        return []
    forked = report.get("fork_at") is not None
    lines = ["", f"## At equal model FLOPs ({design_label(report)})", "",
             f"The baseline's model FLOPs at the compared point ({matched[0][1]['flops']:.4g}): each variant's "
             f"{report['metric']} at the token count where it spent as much"
             + (", its trunk's tokens counted at the baseline's FLOPs per token (the trunk is the baseline's model)"
                if forked else "")
             + f", read from the final evaluation of a run whose own schedule ends there (a variant of other FLOPs "
             f"per token: its schedule-end runs, suite option equal_flops_runs), paired with the baseline seed. "
             f"Never a value read mid-schedule or interpolated: a seed whose run ended more than "
             f"{matched[0][1]['tolerance']:.0%} of the FLOPs budget away is 'not evaluated', and a variant without "
             f"schedule-end runs gets no verdict here. A family of its own: Holm over these {len(matched)} comparisons at alpha "
             f"{report['alpha']:.3g}, each interval at its Holm step's level (not simultaneous).", "",
             "| variant | FLOPs/token x | tokens at equal FLOPs | run ended at | diff vs baseline | verdict | "
             "interval (confidence) | p | p (Holm) |", "|---|---|---|---|---|---|---|---|---|"]
    for name, m in matched:
        at = sorted({t for t in m.get("evaluated_at", {}).values() if t is not None})
        lines.append(f"| {name} | {m['flops_ratio']:.3f} | {thousands(round(m['tokens']) if m['tokens'] else None)} | "
                     f"{', '.join(f'{t:,}' for t in at) or '-'} | {signed(m['diff_mean'])} | {m['verdict']} | "
                     f"{interval_cell(m)} | {fmt(m['p_value'], 3)} | {fmt(m['p_holm'], 3)} |")
    lines += [f"- {name}: {why(m)}" for name, m in matched if m["verdict"] == "not evaluated"]
    return lines


def timed(cost):
    """How many of a cost's runs its throughput rests on: 'all flagged' when none is trusted."""
    return f"{cost['timed_runs']} of {cost['runs']}" if cost["timed_runs"] else "all flagged"


def cost_lines(report):
    costs = [(n, v["cost"], v.get("cost_ratio", {})) for n, v in report["variants"].items() if v.get("cost")]
    if not costs:
        return []
    trunk = report.get("trunk_cost")
    lines = ["", f"## Cost ({design_label(report)})", "",
             "Throughput per run = its tokens / its summed training-step time; the median over seeds [min, max] "
             "whose timings are trusted (a flagged run, listed below, is left out; n timed says how many are "
             "left), and the step time that follows from it."
             + (" A branch counts only its own steps after the fork (its log carries its trunk's tokens and time "
                "on); the trunks, one per seed and shared by every branch, stand on their own row." if trunk else "")
             + " FLOPs per token count every matmul with weights (6N) and "
             "the attention as it runs (RA's mix doubles the score width; a learned gate runs two attentions). "
             "No throughput ratio is given where half or more of the variant's or the baseline's runs are flagged.",
             "", "| variant | tokens/s [range] | n timed | x baseline | step time ms | parameters | x | FLOPs/token | "
             "x | peak mem MiB | highest load |", "|" + "---|" * 11]
    for name, c, ratio in costs:
        low, high = c["tokens_per_sec_range"]
        speed = "not trusted (flagged)" if "tokens_per_sec_withheld" in ratio else fmt(ratio.get("tokens_per_sec"), 3)
        lines.append(f"| {name} | {c['tokens_per_sec']:,.0f} [{low:,.0f}, {high:,.0f}] | {timed(c)} | "
                     f"{speed} | {fmt(c['step_time_ms'], 4)} | {thousands(c['parameters'])} | "
                     f"{fmt(ratio.get('parameters'), 4)} | {thousands(c['flops_per_token'])} | "
                     f"{fmt(ratio.get('flops_per_token'), 4)} | {fmt(c['peak_memory_mib'], 4)} | {fmt(c['max_load'], 3)} |")
    if trunk:
        low, high = trunk["tokens_per_sec_range"]
        lines.append(f"| (trunks, baseline model) | {trunk['tokens_per_sec']:,.0f} [{low:,.0f}, {high:,.0f}] | "
                     f"{timed(trunk)} | - | "
                     f"{fmt(trunk['step_time_ms'], 4)} | {thousands(trunk['parameters'])} | - | "
                     f"{thousands(trunk['flops_per_token'])} | - | {fmt(trunk['peak_memory_mib'], 4)} | "
                     f"{fmt(trunk['max_load'], 3)} |")
    unreliable = [unreliable_text(r) for _, c, _ in costs + ([("trunk", trunk, {})] if trunk else [])
                  for r in c["unreliable"]]
    if unreliable:
        lines += ["", f"**Timings not to be trusted** (logged step times spread more than "
                      f"x{compare.TIMING_SPREAD_LIMIT} between the 10th and 90th percentile, e.g. other work on the "
                      f"machine; left out of the throughputs and their ratios): " + ", ".join(unreliable)
                  + ". Compare FLOPs per token too, or time on an idle machine (tools/bench_train_step.py)."]
    return lines


def hellaswag_lines(report):
    lines = []
    paired = [(n, v["hellaswag_paired"]) for n, v in report["variants"].items() if v.get("hellaswag_paired")]
    if paired:
        lines += ["", f"## HellaSwag at {fmt(report['hellaswag_tokens'])} tokens, the largest count every finished "
                  f"run evaluated it at", "",
                  f"Judged like the metric, with the seed as the unit: each seed's acc_norm difference (variant - "
                  f"baseline, higher is better), Holm over the {len(paired)} comparisons at alpha "
                  f"{report['alpha']:.3g}.", "",
                  "| variant | seeds | acc_norm diff | verdict | interval (confidence) | p | p (Holm) |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {n} | {len(h['seeds'])} | {signed(h['diff_mean'])} | {h['verdict']} | {interval_cell(h)} | "
                  f"{fmt(h['p_value'], 3)} | {fmt(h['p_holm'], 3)} |" for n, h in paired]
    pooled = [(n, v["hellaswag"]) for n, v in report["variants"].items() if "hellaswag" in v]
    if pooled:
        lines += ["", f"Each variant's accuracy pooled over its seeds (a description: Clopper-Pearson "
                      f"{pct(pooled[0][1]['confidence'])}, the family's level, over items x seeds):", "",
                  "| variant | n | acc_norm | interval | chance (0.25) inside |", "|---|---|---|---|---|"]
        lines += [f"| {n} | {h['n']} | {h['acc_norm']['value']:.4f} | [{h['acc_norm']['interval'][0]:.4f}, "
                  f"{h['acc_norm']['interval'][1]:.4f}] | {'yes' if h['acc_norm']['chance_inside'] else 'no'} |"
                  for n, h in pooled]
    per_item = [(n, v["hellaswag_per_item"]) for n, v in report["variants"].items() if v.get("hellaswag_per_item")]
    if per_item:
        lines += ["", "Where it comes from, item by item (the same items in both runs of a seed, summed over seeds):", "",
                  "| variant | items | seeds | acc_norm diff | only variant right | only baseline right |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {n} | {h['items']} | {len(h['seeds'])} | {h['diff']:+.4f} | {h['variant_only']} | "
                  f"{h['baseline_only']} |" for n, h in per_item]
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
        # a value logged as null (or NaN) is left out of the line: the report names such a run as non-finite
        ys = np.array([[math.nan if c[x] is None else c[x] for x in xs] for c in curves], dtype=float)
        ys[~np.isfinite(ys)] = math.nan
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN column: no point there
            ax.plot(xs, np.nanmean(ys, axis=0), label=f"{name} ({len(curves)} seeds)")
            ax.fill_between(xs, np.nanmin(ys, axis=0), np.nanmax(ys, axis=0), alpha=0.2)
        later += [y for y in ys[:, 1:].ravel().tolist() if math.isfinite(y)]  # a NaN run is named in the report
    if later:
        pad = 0.05 * (max(later) - min(later) or 1.0)
        ax.set_ylim(min(later) - pad, max(later) + pad)
    if report["compared_at_tokens"]:
        ax.axvline(report["compared_at_tokens"], color="gray", linestyle=":", label="compared here")
    ax.set(xlabel="tokens", ylabel=f"{metric} ({UNITS[metric]})",
           title=f"{metric} (mean, band = min..max over seeds), {design_label(report)}")
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
    """Each variant's mean paired difference with the interval its verdict rests on (black: the Holm
    step's, labelled with its confidence; blue: the simultaneous 1 - alpha/k interval that claims about
    the margin rest on), the ±min_effect band and which side is better; the design in the title."""
    fig, ax = plt.subplots(figsize=(7.5, 0.7 * len(compared) + 1.8))
    for i, (name, v) in enumerate(compared):
        ax.plot([v["diff_mean"]], [i], "o", color="black")
        if v.get("interval") and v["verdict"] != "equivalent":
            ax.plot(v["interval"], [i, i], "-", color="black")
        if v.get("equivalence_interval"):
            ax.plot(v["equivalence_interval"], [i - 0.12, i - 0.12], "-", color="tab:blue", linewidth=2)
        ax.annotate(f"{v['diff_mean']:+.4f}  {interval_cell(v)}", (v["diff_mean"], i),
                    textcoords="offset points", xytext=(0, 7), ha="center", fontsize=7)
    ax.axvline(0, color="gray", linestyle=":")
    if report.get("min_effect"):
        ax.axvspan(-report["min_effect"], report["min_effect"], color="tab:blue", alpha=0.12,
                   label=f"±min_effect {report['min_effect']:g}")
        ax.legend(fontsize=8, loc="lower right")
    ax.set_yticks(range(len(compared)), [f"{n}: {v['verdict']}" for n, v in compared])
    ax.set_ylim(-0.7, len(compared) - 0.3)
    left, right = ("better", "worse") if report["goal"] == "lower" else ("worse", "better")
    ax.set(xlabel=f"{report['metric']}: variant - baseline (same seed)\neach interval at the level its verdict was "
                  f"tested;   {left} <-   |   -> {right}",
           title=f"paired differences, {design_label(report)}")
    return fig, "paired_differences.png"


def finite_points(run, metric):
    """{tokens: value} of a run's finite evaluations: a value logged as null or NaN is left out of a plot
    (the report names the run as non-finite)."""
    return {t: v for t, v in metric_by_tokens(run, metric).items() if v is not None and math.isfinite(v)}


def differences_over_tokens(report, runs, names, plt):
    """Per variant, variant - baseline at every evaluation both runs of a seed share, one line per seed:
    whether a difference is steady or only where the comparison happens to be made."""
    fig, axes = plt.subplots(1, len(names), figsize=(3.2 * len(names) + 1, 3.4), sharey=True, squeeze=False)
    for ax, name in zip(axes[0], names):
        for (variant, seed), run in sorted(runs.items(), key=lambda item: str(item[0])):
            base = runs.get((report["baseline"], seed))
            if variant != name or base is None or run["status"] != "finished" or base["status"] != "finished":
                continue
            mine, theirs = finite_points(run, report["metric"]), finite_points(base, report["metric"])
            xs = sorted(set(mine) & set(theirs))[1:]  # from the first evaluation after the start
            ax.plot(xs, [mine[x] - theirs[x] for x in xs], marker=".", label=f"seed {seed}")
        ax.axhline(0, color="gray", linestyle=":")
        if report.get("min_effect"):
            ax.axhspan(-report["min_effect"], report["min_effect"], color="tab:blue", alpha=0.12)
        if report["compared_at_tokens"]:
            ax.axvline(report["compared_at_tokens"], color="gray", linestyle="--", linewidth=0.8)
        ax.set(title=f"{name}, {design_label(report)}", xlabel="tokens")
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


# ----------------------------------------------------------------------------- a ladder: across sizes


def rule_text(rule):
    base, power = rule
    return "the same at every size" if power == 0 else f"∝ {'N' if base == 'params' else 'n_embd'}^{power:.3g}"


def extrapolation_text(across, fit):
    target = across["extrapolate_to"]
    if not target or not fit:
        return ""
    e = fit["extrapolated"]
    largest = max(s["params"] for s in across["sizes"].values())
    if e.get("supported") is False:  # ablation/ladder_power.py: beyond one ladder width past the largest size
        return (f" Extrapolated to {target['name']} (N = {target['params']:,}, {e['widths']:.3g} ladder widths past "
                f"the largest size): UNSUPPORTED LINE, no interval: the straight line reads {e['effect']:+.4g} there, "
                f"but an interval is given only up to N = {e['limit']:,.0f} (one ladder width past the largest size).")
    return (f" Extrapolated to {target['name']} (N = {target['params']:,}, {target['params'] / largest:.3g}x the largest "
            f"size run): {e['effect']:+.4g} {span(e['interval'])} ({pct(fit['confidence'])}): an "
            f"extrapolation of a straight line in ln N beyond every measured size, not a measurement.")


def stated_fit(v):
    """A variant's fit where its trend may be read: a withheld trend's fit stays in report.json only."""
    return None if v["trend"] == "withheld" else v["fit"]


def detectable_text(v):
    """Every trend statement with the slope the ladder could have detected (ablation/ladder_power.py)."""
    found = v.get("detectable")
    if not found:
        return ""
    basis = (f"simulated with its per-seed test from the paired-difference sd pooled over its sizes, {found['sd']:.2g} "
             f"on {found['df']} df, sizes independent")
    return (f" This ladder could have detected a slope of {found['slope']:.3g} per e-fold of N (80% power at its "
            f"level, {basis})." if found["slope"] else
            f" This ladder could not detect any slope within 100 sds per e-fold of N at 80% power ({basis}).")


def left_out_text(fit):
    """The seeds a per-seed fit could not use, by name."""
    if not fit or not fit["left_out"]:
        return ""
    return (f" Fitted on seeds {', '.join(fit['seeds'])}; left out, missing a size: "
            + ", ".join(f"seed {s} ({', '.join(sizes)})" for s, sizes in fit["left_out"].items()) + ".")


def lr_check_lines(report):
    """The baseline at other multiples of the rule's learning rate at the ladder's ends (ladder lr_check)."""
    check = report.get("lr_check")
    if not check:
        return []
    lines = ["", "## Learning rate checked at the ends", "",
             "The baseline from scratch, the whole budget, at multiples of the rule's learning rate (one seed): the "
             "rule is supported at a size when 1x is not beaten by more than the margin. Where it is not, the trends "
             "above are withheld.", "",
             "| size | " + " | ".join(f"{f:g}x lr" for f in check["factors"]) + " | best | rule holds |",
             "|---|" + "---|" * (len(check["factors"]) + 2)]
    for size, row in check["sizes"].items():
        lines.append(f"| {size} | " + " | ".join(fmt(row["values"].get(f"{f:g}")) for f in check["factors"])
                     + f" | {fmt(row['best'])} | {holds_text(row)} |")
    return lines


def ladder_markdown(report, plot):
    across, metric = report["across_sizes"], report["metric"]
    sizes = across["sizes"]
    lines = [f"# Ablation report across sizes: {report['suite']}", "",
             f"Deciding metric (declared before the runs): **{metric}** ({report['goal']} is better), paired "
             f"differences variant minus baseline (`{report['baseline']}`), same seed, same size. Each size is one "
             f"family (Holm within it at its own alpha, its full report linked below), compared at the largest token "
             f"count its runs share. Across sizes only the ladder's keys differ: the shape of each size, and from the "
             f"recipe of size `{across['reference']}` the token budget {rule_text(across['tokens_rule'])} (max_iters "
             f"and warmup) and the learning rate {rule_text(across['learning_rate_rule'])} (learning_rate and min_lr), "
             f"N being the non-embedding parameters 12 n_layer n_embd^2. Keys allowed to differ within a size: "
             f"{', '.join(report['allowed']) or 'none'}.",
             "", f"Learning rate: the recipe's at `{across['reference']}`, "
                 f"{report.get('tuning') or 'no run of that size, so its tuning is not known'}; every other size's "
                 f"follows the rule (the table's column), checked at the ends below.",
             "", "Design: " + "; ".join(f"`{size}` {d}" for size, d in report.get("designs", {}).items()),
             "", "| size | shape | N | learning rate | compared at tokens | report |", "|---|---|---|---|---|---|"]
    for size, s in sizes.items():
        per = report["per_size"].get(size)
        lines.append(f"| {size} | {', '.join(f'{k}={v}' for k, v in s['shape'].items())} | {s['params']:,} | "
                     f"{fmt(per.get('learning_rate')) if per else '-'} | "
                     f"{thousands(per['compared_at_tokens']) if per else '-'} | "
                     + (f"[{per['report']}]({per['report']})" if per else "no runs") + " |")
    lines += ["", "## Across sizes", "",
              f"The effect at each size with the interval its size's Holm step tested. Every size shares each "
              f"seed's data order, so within a seed the sizes are correlated and only seeds are independent: per "
              f"seed, the least-squares line of its paired differences against ln N; the trend is the seeds' mean "
              f"line, its slope per e-fold of N with a Student t interval over the seeds (seeds - 1 degrees of "
              f"freedom) at {pct(1 - across['level'])} (family-wise alpha {across['alpha']:g} over the "
              f"{across['comparisons']} variants, Bonferroni). No trend is stated (withheld) while the learning-rate "
              f"check does not support the rule's rate or a size's forked verdicts do not stand. Training FLOPs = "
              f"the variant's FLOPs per token x the compared tokens (they differ between variants and sizes).", "",
              "| variant | size | N | parameters (measured) | training FLOPs | seeds | diff vs baseline | interval "
              "(confidence) | verdict at this size |", "|" + "---|" * 9]
    for name, v in across["variants"].items():
        for e in v["effects"]:
            ci = (f"{span(e['interval'])} {pct(e['interval_confidence'])}" if e.get("interval") else "-")
            flops = format(e["compute"], ".3g") if e.get("compute") else "-"
            lines.append(f"| {name} | {e['size']} | {e['params']:,} | {thousands(e.get('measured_parameters'))} | "
                         f"{flops} | {e['n']} | {signed(e['diff'])} | {ci} | {e['verdict']} |")
    lines += ["", "| variant | trend | seeds | slope per e-fold of N | interval (confidence) | p | fitted at smallest | "
                  "fitted at largest |", "|" + "---|" * 8]
    for name, v in across["variants"].items():
        f = stated_fit(v)
        lines.append(f"| {name} | **{v['trend']}** | " + (
            f"{len(f['seeds'])} | {f['slope']:+.4g} | {span(f['slope_interval'])} {pct(f['confidence'])} | "
            f"{f['p']:.3g} | {f['smallest']['effect']:+.4g} {span(f['smallest']['interval'])} | "
            f"{f['largest']['effect']:+.4g} {span(f['largest']['interval'])} |" if f else
            "- | - | - | - | - | - |"))
    lines += ["", "What each variant does across sizes:", ""]
    lines += [f"- **{name}**: {v['trend']}: {why(v)}." + left_out_text(v["fit"]) + detectable_text(v)
              + extrapolation_text(across, stated_fit(v)) for name, v in across["variants"].items()]
    lines += lr_check_lines(report)
    lines += ["", "A ladder tells how an effect moves over the sizes it ran, under its own rules for tokens and "
                  "learning rate; a trend fitted on a few small sizes says nothing certain about sizes far beyond "
                  "them (docs/ablation.md, 'Across sizes').", ""]
    if plot:
        lines += [f"![effect against size and compute]({plot})"]
    return "\n".join(lines) + "\n"


def ladder_plot(report, out_dir):
    """Per variant the effect at each size with its interval, against N (log x) with the fitted line
    and its band (none for a withheld trend), and against training FLOPs (log x)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    across = report["across_sizes"]
    fig, (by_n, by_flops) = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for i, (name, v) in enumerate(across["variants"].items()):
        color = f"C{i}"
        have = [e for e in v["effects"] if e["diff"] is not None]
        for ax, key in ((by_n, "params"), (by_flops, "compute")):
            points = [e for e in have if e.get(key)]
            if not points:
                continue
            xs, ys = [e[key] for e in points], [e["diff"] for e in points]
            errors = [[e["diff"] - e["interval"][0] if e.get("interval") else 0 for e in points],
                      [e["interval"][1] - e["diff"] if e.get("interval") else 0 for e in points]]
            ax.errorbar(xs, ys, yerr=errors, fmt="o", color=color, capsize=3, label=f"{name}: {v['trend']}")
            if i == 0:  # the sizes' names once, under the first variant's points
                for e in points:
                    ax.annotate(e["size"], (e[key], e["diff"]), textcoords="offset points", xytext=(4, -10), fontsize=7)
        if stated_fit(v):
            grid = np.geomspace(min(e["params"] for e in have), max(e["params"] for e in have), 50)
            line = [ladder.fitted(v["fit"], n) for n in grid]
            by_n.plot(grid, [p["effect"] for p in line], "-", color=color, linewidth=1)
            by_n.fill_between(grid, [p["interval"][0] for p in line], [p["interval"][1] for p in line], color=color,
                              alpha=0.12)
    for ax in (by_n, by_flops):
        if ax.has_data():
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # crowded over a short range
        else:  # runs that logged no FLOPs per token (older logs)
            ax.text(0.5, 0.5, "no FLOPs per token recorded", ha="center", transform=ax.transAxes)
        ax.axhline(0, color="gray", linestyle=":")
    by_n.set(xlabel="non-embedding parameters N (log)", ylabel=f"{report['metric']}: variant - baseline",
             title="effect against size (fit: band at the across-size level)")
    by_flops.set(xlabel="training FLOPs at the compared point (log)", title="effect against compute")
    by_n.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "effect_vs_size.png"), dpi=110)
    plt.close(fig)
    return "effect_vs_size.png"


# ----------------------------------------------------------------------------- how far a forked answer carries

def answer_of(report, name):
    """The answer that stands for a variant (bridge.answers), or its own verdict for a report built before answers."""
    v = report["variants"][name]
    return (report.get("answers") or {}).get(name) or dict({k: v.get(k) for k in (
        "verdict", "reasons", "n", "diff_mean", "interval", "interval_confidence", "equivalence_interval",
        "equivalence_confidence", "p_holm", "contrast")}, source="forked" if report.get("fork_at") is not None else "from_scratch",
        replaces=None)


ANSWER_SOURCES = {  # which runs an answer comes from (bridge.answers)
    "forked": lambda report: design_label(report), "from_scratch": lambda report: "from scratch",
    "bridge": lambda report: "from scratch (the bridge's seeds)"}


def answer_design(report, a):
    return ANSWER_SOURCES[a["source"]](report)


def answer_interval(a):
    """The interval an answer is quoted with: the simultaneous one for claims about the margin, else the Holm step's."""
    if a.get("contrast"):  # the blocked analysis: its one interval is simultaneous, margin or not
        return a["interval"], a["interval_confidence"], "simultaneous"
    if a["verdict"] in ("equivalent",) or a["verdict"].endswith("negligible"):
        return a["equivalence_interval"], a["equivalence_confidence"], "simultaneous"
    return a["interval"], a["interval_confidence"], "Holm step"


def sentence(report, name):
    """One plain sentence: what was found for the variant, by which design, how sure."""
    a, metric = answer_of(report, name), report["metric"]
    units = UNITS.get(metric, "")
    interval, confidence, kind = answer_interval(a)
    where = f"{span(interval)} ({pct(confidence)} {kind}, {a['n']} seeds)" if interval else \
        f"({a['n']} seeds)"
    verdict = a["verdict"]
    if verdict.startswith(("better", "worse")):
        found = (f"is **{verdict.split(',')[0]}** than the baseline by {signed(a['diff_mean'])} {units} {where}"
                 + (", smaller than the margin that matters (±" + fmt(report["min_effect"]) + ")"
                    if verdict.endswith("negligible") else ""))
    elif verdict == "equivalent":
        found = f"is **equivalent** to the baseline within ±{fmt(report['min_effect'])}: {signed(a['diff_mean'])} {where}"
    elif verdict == "inconclusive":
        plan = ((report.get("plan") or {}).get("per_variant") or {}).get(name) or {}
        seen = plan.get("detectable") if not a.get("replaces") else None
        found = (f"**cannot be told from the baseline**: {signed(a['diff_mean'])} {where}"
                 + (f"; these seeds detect about {fmt(seen, 2)} (80% power, planned from the sd's upper bound)"
                    if seen else ""))
    else:
        found = f"has **no answer** ({verdict}: {why(a)})"
    replaced = (f" (the forked verdict, {a['replaces']['verdict']}, does not stand: "
                f"{why(a['replaces'])})" if a.get("replaces") else "")
    return f"- **{name}**, {answer_design(report, a)}: {found}{rate_clause(report, name)}{replaced}."


def rate_clause(report, name):
    """Which learning rate the variant ran at against the baseline's, and whether that was its own best on the
    tuning seeds: best against best, a same-rate answer that may not be, or another rate."""
    best = ((report.get("tuning") or {}).get("best_factors") or {}).get(name)
    ran, base = report["variants"][name].get("learning_rate"), (report.get("about") or {}).get("learning_rate")
    factor = ran / base if ran and base else 1.0
    if not math.isclose(factor, 1.0, rel_tol=1e-3):
        own = best is not None and math.isclose(factor, best, rel_tol=1e-3)
        return (f"; at {factor:g}x the baseline's rate" + (", its own best on the tuning seeds: best against best"
                                                             if own else ""))
    if best and best != 1:
        return (f"; its own best rate on the tuning seeds is {best:g}x the baseline's, so this same-rate answer may "
                f"not be its best against the baseline's best")
    return ""


def headline(report):
    """The report's first lines: one sentence per variant, the recipe they hold at, and how far they carry.
    The table's verdict column and the why-lines quote the same answers (answer_of)."""
    names = [n for n in report["variants"] if n != report["baseline"]]
    if not names:
        return []
    a = report.get("about") or {}
    recipe = (f"at learning rate {fmt(a.get('learning_rate'))} ({'tuned' if is_tuned(report) else '**untuned**'})"
              if a.get("learning_rate") is not None else "")
    family = "blocked many-to-one" if report.get("analysis") == "blocked" else "Holm"
    alpha = report["alpha"]
    if report.get("stop_decided_at"):  # each arm at its own last look's level; the family at the declared alpha
        family, alpha = f"sequential {family}, looks at {report['stop_decided_at']} seeds,", report["look"]["alpha"]
    return ["", f"**What this suite found** {recipe} ({family} over {report['comparisons']} at family-wise alpha "
                f"{alpha:.3g}; ±{fmt(report.get('min_effect'))} is the smallest effect that matters):", "",
            *[sentence(report, n) for n in names], "", f"How far it carries: {carry_text(report)}." if a else ""]


def verdict_cell(report, name, v):
    if name == report["baseline"]:
        return f"**{v['verdict']}**"
    a = answer_of(report, name)
    return f"**{a['verdict']}**" + (f" (from scratch, the bridge's seeds; forked: {a['replaces']['verdict']}, "
                                    f"does not stand)" if a.get("replaces") else bridge_cell(report, name))


def why_line(report, name, v):
    if name == report["baseline"]:
        return f"- **{name}** ({design_label(report)}): {v['verdict']}: {why(v)}."
    a = answer_of(report, name)
    line = f"- **{name}** ({answer_design(report, a)}): {a['verdict']}: {why(a)}."
    if a.get("replaces"):
        line += (f" In its place the forked verdict ({answer_design(report, a['replaces'])}) was "
                 f"{a['replaces']['verdict']}: "
                 f"{why(v)}; it does not stand ({why(a['replaces'])}).")
    return line + bridge_why(report, name)


def bridge_cell(report, name):
    b = (report.get("bridge") or {}).get("variants", {}).get(name)
    return f" (bridge: {b['status']})" if b else ""


def bridge_why(report, name):
    b = (report.get("bridge") or {}).get("variants", {}).get(name)
    if not b:
        return ""
    return f" The bridge: {b['status']} ({why(b)})."


def ratio_text(b):
    if b["kind"] == "bounded":
        return f"{fmt(b['ratio'], 3)} {span(b['interval'])}"
    if b["kind"] == "unbounded":
        return f"{fmt(b['ratio'], 3)}, unbounded (the from-scratch interval holds 0)"
    return "-"


def transfer_lines(report):
    """The loss jump at the fork per variant and the bridge's table."""
    lines = []
    jumps = report.get("fork_jumps")
    if jumps is not None:
        margin = report.get("min_effect")
        lines += ["", "## Loss jump at the fork", "",
                  f"Each branch's first evaluation (at the fork point) minus its seed's baseline branch's: what the "
                  f"variant starts the comparison from. A jump beyond the margin (±{fmt(margin)}) is a design problem "
                  f"(new parameters starting cold, fork_start='own'), not an effect." if margin else
                  "Each branch's first evaluation (at the fork point) minus its seed's baseline branch's (no margin "
                  "declared, so no jump is judged).", "",
                  "| variant | mean jump | per seed | judged |", "|---|---|---|---|"]
        for name, j in jumps.items():
            lines.append(f"| {name} | {signed(j['mean'])} | {', '.join(signed(x) for x in j['per_seed'].values())} | "
                         + ("no evaluation at the fork point (an eval_interval that divides fork_at shows it)"
                            if j["mean"] is None else "**design problem: beyond the margin**" if j["beyond_margin"]
                            else "within the margin" if j["margin"] else "-") + " |")
    b = report.get("bridge")
    if b:
        level = next(iter(b["variants"].values()))["confidence"] if b["variants"] else None
        lines += ["", "## How far the forked answer carries (bridge to from scratch)", "",
                  f"Every variant also trained from scratch on seeds {b['seeds']} ({design_text(b)}), compared at "
                  f"{fmt(b['compared_at_tokens'])} tokens. Every interval in this table is at {pct(level or 0)} "
                  f"(each comparison's share of the family's alpha), each side with its own seeds; the ratio forked / "
                  f"from scratch with Fieller's interval (Welch-type df), unbounded when the from-scratch effect cannot "
                  f"be told from 0. Status: confirmed (both decided, same sign), conflict (both decided, opposite "
                  f"signs), negligible in both (both inside ±{fmt(report.get('min_effect'))}), lost at the fork (the forked one inside it, the from-scratch one decided), underpowered (a side "
                  f"holds 0: the effect its seeds could have seen is given). Only confirmed or negligible in both lets "
                  f"a forked verdict answer \"does it help?\".", "",
                  "| variant | forked effect [interval] (seeds) | from-scratch effect [interval] (seeds) | "
                  "from-scratch per seed | ratio [interval] | bridge |", "|---|---|---|---|---|---|"]
        for name, v in b["variants"].items():
            seen = "; ".join(f"{side} could see {fmt(x, 2)}" for side, x in (v.get("could_see") or {}).items())
            lines.append(f"| {name} | {signed(v['forked'])} {span(v['forked_interval']) if v.get('forked_interval') else ''}"
                         f" ({v['forked_n']}) | {signed(v['scratch'])} "
                         f"{span(v['scratch_interval']) if v.get('scratch_interval') else ''} ({v['scratch_n']}) | "
                         f"{', '.join(f'{signed(x)}' for x in (v.get('scratch_per_seed') or {}).values()) or '-'} | "
                         f"{ratio_text(v)} | **{v['status']}**{' (' + seen + ')' if seen else ''} |")
    return lines


# ----------------------------------------------------------------------------- words for the engine's codes
# stats, compare, bridge and ladder return verdict codes and reasons as data ({"code": ..., the numbers it
# rests on}); every sentence about them is written here.

def pct(confidence):
    return f"{100 * confidence:.4g}%"


def span(ci):
    return f"[{ci[0]:+.4g}, {ci[1]:+.4g}]"


def step_interval(r):
    return f"the {pct(r['confidence'])} interval {span(r['interval'])} (at Holm's step level {r['step_level']:.3g}, " \
           f"not simultaneous)"


def blocked_interval(r):
    return (f"the simultaneous {pct(r['confidence'])} interval {span(r['interval'])} (blocked many-to-one, critical "
            f"|t| {r['critical']:.3g}, the larger of the bootstrap's and the multivariate t's on {r['family_df']:.3g} "
            f"df; this contrast's own df {r['df']:.3g})")


def simultaneous(r):
    return f"the simultaneous {pct(r['confidence'])} interval {span(r['interval'])}"


def within_margin(r):
    return f"{simultaneous(r)} lies within ±{r['min_effect']:g} (TOST p {p_is(r['tost_p'])} < {r['tost_level']:.3g})"


def run_text(who):
    return f"{'seed' if who['variant'] else 'baseline seed'} {who['seed']}"


LR_FAILING = {  # why the learning-rate check fails at a ladder's end (ladder.withheld_because)
    "not_run": lambda r: f"{r['size']}: not run",
    "too_few_factors": lambda r: f"{r['size']}: {r['finished']} of {r['factors']} factors finished",
    "rule_fails": lambda r: f"{r['size']}: {HOLDS[r['holds']](r)}"}


def deterministic_text(r):
    kind = "exactly equal runs" if r["exact"] else f"a constant offset of {r['offset']:+.4g} in every seed"
    return (f"{kind} (spread within {r['rtol']:g} of the metric): no seed-to-seed variance, so no test applies; "
            f"compare the code paths")


def code_lines(report):
    """Which code the runs trained at (runrecord.code_version): one version, or each with its seeds."""
    versions = report.get("code_versions") or {}
    if len(versions) < 2:
        return [f"Every run trained at code version {next(iter(versions))}.", ""] if versions else []
    return [f"The runs trained at {len(versions)} code versions, pooled across seeds (a pair split across two is "
            f"refused as a confound): " + "; ".join(f"{v}: seed{'s' if len(s) > 1 else ''} {seed_ranges(s)}"
                                                   for v, s in versions.items()) + ".", ""]


def incomplete_text(r):
    """The unfinished runs by side and status, seeds as ranges (a long suite mid-way has dozens not yet run)."""
    groups = {}
    for w in r["unfinished"]:
        groups.setdefault((w["variant"], w["status"]), []).append(w["seed"])
    broken = [f"{'seed' if variant else 'baseline seed'}{'s' if len(seeds) > 1 else ''} {seed_ranges(seeds)} {status}"
              for (variant, status), seeds in groups.items()]
    broken += [f"{run_text(w)} has a {r['metric']} that is not finite" for w in r["non_finite"]]
    return ", ".join(broken) + " (counted, not dropped)"


def seed_ranges(seeds):
    """[49, 50, 51, 60] -> '49-51, 60' (seeds that are not integers are listed as they are)."""
    if not all(isinstance(s, int) for s in seeds):
        return ", ".join(map(str, seeds))
    runs, ordered = [], sorted(seeds)
    for s in ordered:
        if runs and s == runs[-1][1] + 1:
            runs[-1][1] = s
        else:
            runs.append([s, s])
    return ", ".join(f"{a}-{b}" if b > a else f"{a}" for a, b in runs)


def slope_text(r):
    return (f"the slope's {pct(r['confidence'])} interval {span(r['interval'])} per e-fold of N excludes 0: the "
            f"difference moves {'away from' if r['away'] else 'towards'} zero as N grows (towards "
            f"{'better' if r['better'] else 'worse'})"
            + ("; the fitted line crosses 0 inside the ladder, but neither end's interval establishes a sign change"
               if r["crosses"] else ""))


STOPS = {"within_margin": "lies inside ±min_effect", "beyond_margin": "lies wholly beyond ±min_effect",
         "excludes_zero": "excludes 0"}  # stats.stop_code -> why a look stopped an arm


def sequential_analysis_text(report):
    """The stopping rule of a suite that declared stop_decided (compare.decide_sequential): its looks, and the
    runs of each stopped arm that were never made."""
    looks = report["blocked_analysis"].get("sequential") or []
    taken = "; ".join(f"look {e['number']} at {e['seeds']} seeds, level {e['level']:.3g}, tested "
                      f"{', '.join(e['tested'])}" + (f", stopped {', '.join(e['stopped'])}" if e["stopped"] else "")
                      for e in looks) or "none yet"
    stopped = "".join(f" {v} stopped at look {s['look_number']} ({s['seeds']} seeds): decided, so {', '.join(s['runs'])} "
                      f"{'was' if len(s['runs']) == 1 else 'were'} never run." for v, s in report["stopped"].items()
                      if s["runs"])
    width = report.get("stop_half_width")
    narrow = " and is at most ±" + fmt(width) + " wide (half-width)" if width else ""
    narrowed = "".join(f" The half-width condition (±{fmt(e['stop_half_width'])}) was set after the look(s) at "
                       f"{', '.join(map(str, e['looked_at'])) or 'no'} seeds: going on past a look never costs a "
                       f"repeated interval its coverage, so a rule that stops later keeps the level; it may only narrow."
                       for e in report.get("half_width_narrowed") or [])
    return (f"**Sequential** (stop_decided, looks {report['stop_decided_at']} declared before the runs): at each look "
            f"the blocked analysis of the baseline and the arms still open tests at that look's share of alpha "
            f"(O'Brien-Fleming-type spending, the largest |t| over all {report['comparisons']} planned contrasts); an arm "
            f"whose interval decides it{narrow} stops, the others and the baseline go on. Each verdict is at its arm's "
            f"last look, its interval a repeated confidence interval (all looks together cover with probability >= "
            f"{pct(1 - report['look']['alpha'])} whatever the stopping). The {adjusted_p_column(report)} column holds "
            f"each arm's single-step simultaneous p at its last look (against that look's level), the p column the "
            f"paired t-test's raw p (evidence).{narrowed} Looks: {taken}.{stopped} ")


REASONS = {  # reason code -> its words, from the numbers the reason carries
    # stats.decide
    "too_few_seeds": lambda r: f"{r['n']} paired seed{'s' if r['n'] != 1 else ''}: at least {r['needed']} are "
                               f"needed for a verdict",
    "deterministic": deterministic_text,
    "holm_rejects": lambda r: f"Holm-adjusted p = {r['p_holm']:.3g} < {r['alpha']:g}; {step_interval(r)} excludes 0",
    "negligible": lambda r: f"{within_margin(r)}: a real difference smaller than min_effect",
    "beyond_margin": lambda r: f"{simultaneous(r)} excludes ±{r['min_effect']:g} too",
    "not_beyond_margin": lambda r: f"{simultaneous(r)} does not exclude effects smaller than {r['min_effect']:g}",
    "sign_flip_floor": lambda r: f"with {r['n']} seeds the sign-flip test cannot go below {r['smallest_p']:.3g}, "
                                 f"above the level {r['level']:.3g}: this verdict rests on the t-test's normality",
    "equivalent": lambda r: f"equivalent within ±{r['min_effect']:g}: {within_margin(r)}",
    "holm_holds_zero": lambda r: f"Holm-adjusted p = {r['p_holm']:.3g}; {step_interval(r)} holds 0",
    "blocked_rejects": lambda r: f"simultaneous p {p_is(r['p_adjusted'])} < {r['alpha']:g}; {blocked_interval(r)} "
                                 f"excludes 0",
    "blocked_holds_zero": lambda r: f"simultaneous p {p_is(r['p_adjusted'])}; {blocked_interval(r)} holds 0",
    "reaches_margin": lambda r: f"{simultaneous(r)} reaches beyond ±{r['min_effect']:g}",
    "stopped_at_look": lambda r: f"stopped at look {r['look_number']} of {r['looks']} ({r['seeds']} seeds, level "
                                 f"{r['level']:.3g}): decided, the interval {STOPS[r['stop']]}",
    "open_at_look": lambda r: f"still open at its last look, {r['look_number']} of {r['looks']} ({r['seeds']} seeds, level "
                              f"{r['level']:.3g})",
    "interim": lambda r: f"at its last look so far, {r['look_number']} of {r['looks']} ({r['seeds']} seeds, level "
                         f"{r['level']:.3g}), the difference was {signed(r['mean'])}, {pct(r['confidence'])} interval "
                         f"{span(r['interval'])} (±{fmt((r['interval'][1] - r['interval'][0]) / 2)})"
                         + (f", which decided it ({STOPS[r['stop']]})" if r["stop"] else
                            f": not decided, it runs on to look {r['look_number'] + 1} ({r['next_seeds']} seeds)"
                            if r["next_seeds"] else ": not decided at the last look"),
    "look_waits": lambda r: f"its seeds reach look 1 ({r['seeds']} seeds), but a look is taken only when every open arm "
                            f"has its seeds: it waits for the runs still to finish in {', '.join(r['arms'])}",
    "seed_plan": lambda r: "the suite's seed plan: " + (f"{r['seeds_needed']} seeds for {r['min_effect']:g}"
                                                        if r["seeds_needed"] else "see it below"),
    # compare
    "baseline": lambda r: "the reference of every paired difference",
    "confounds": lambda r: "undeclared differences: " + "; ".join(
        f"{k} = {a!r} vs baseline {b!r}" for k, (a, b) in r["confounds"].items()),
    "measurement": lambda r: "the metric is not measured alike in every run (see Measurement)",
    "unfinished": incomplete_text,
    "records_missing": lambda r: f"missing or damaged: {', '.join(r['records'])}: the measured facts cannot be checked",
    "no_paired_seed": lambda r: "no paired seed finished",
    "not_evaluated": lambda r: f"no finished run ending within {r['tolerance']:.0%} of the baseline's FLOPs in "
                               f"{missing_text(r['missing'])}: no verdict (a value read before a schedule's end is "
                               f"another recipe)",
    "no_paired_seed_at_flops": lambda r: "no paired seed reached the baseline's FLOPs",
    "no_schedule_end_run": lambda r: "no run whose schedule ends at the baseline's FLOPs (the suite did not declare "
                                     "equal_flops_runs = True before its runs; a value read mid-schedule, its learning "
                                     "rate still decaying, is another recipe): no verdict",
    "main_table": lambda r: f"the main table finds this pair {r['verdict']} ({why(r)})",
    # bridge
    "too_few_paired_seeds": lambda r: "fewer than 2 paired seeds in the forked or the from-scratch comparison",
    "both_decided": lambda r: f"both effects decided at {r['confidence']:.4g} ({r['forked']:+.4g} forked, "
                              f"{r['scratch']:+.4g} from scratch), {'same' if r['same_sign'] else 'opposite'} sign"
                              f"{'' if r['same_sign'] else 's'}",
    "both_negligible": lambda r: f"both intervals at {r['confidence']:.4g} lie inside ±{r['min_effect']:g}",
    "lost_at_fork": lambda r: f"the forked effect lies inside ±{r['min_effect']:g} at {r['confidence']:.4g} while the "
                              f"from-scratch one, {r['scratch']:+.4g}, is decided: the fork does not carry it",
    "holds_zero": lambda r: f"the {r['side']} effect {r['mean']:+.4g} cannot be told from 0 at {r['confidence']:.4g} "
                            f"(its {r['n']} seeds could have seen about {r['could_see']:.3g})",
    "not_finished": lambda r: "not finished: " + ", ".join(f"{u['run']} {u['status']}" for u in r["runs"]),
    "bridge": lambda r: f"bridge {r['status']}",  # why a forked verdict does not stand (bridge.add_to_report)
    "fork_jump": lambda r: f"loss jump at the fork {r['mean']:+.4g} beyond the margin ±{r['margin']:g} (a design problem)",
    "no_answer": lambda r: "the forked verdict does not stand and no from-scratch run answers instead",
    # ladder
    "no_run_at_size": lambda r: "no run of this variant at this size",
    "no_runs_at_size": lambda r: "no runs at this size",
    "size_unusable": lambda r: "; ".join(f"{s}: {u['verdict']}: {why(u)}" for s, u in r["sizes"].items()),
    "too_few_complete_seeds": lambda r: (
        f"{r['seeds']} seed(s) with a paired difference at every size, a line per seed needs 2 or more ("
        + ", ".join(f"seed {s} lacks {', '.join(sizes)}" for s, sizes in r["left_out"].items()) + ")"),
    "same_slope": lambda r: "every seed's line has the same slope (deterministic runs): no spread to test it against",
    "decided_opposite": lambda r: "decided in opposite directions: " + ", ".join(
        f"{s} {v}" for s, v in r["verdicts"].items()),
    "ends_opposite": lambda r: f"the fitted effect's {pct(r['confidence'])} intervals at the smallest size "
                               f"{span(r['smallest'])} and at the largest {span(r['largest'])} lie on opposite sides of 0",
    "slope_holds_zero": lambda r: f"the slope's {pct(r['confidence'])} interval {span(r['interval'])} per e-fold of N "
                                  f"holds 0",
    "slope_excludes_zero": slope_text,
    "lr_check_fails": lambda r: "the learning-rate check does not support the rule's rate (" + "; ".join(
        LR_FAILING[f["code"]](f) for f in r["sizes"]) + ")",
    "forked_does_not_stand": lambda r: "the forked verdicts at " + ", ".join(
        f"{size} ({', '.join(REASONS[s['code']](s) for s in stand)})" for size, stand in r["sizes"].items())
                                       + " do not stand",
}
JOINED = {"negligible": ", but "}  # how a reason follows the one before it (else "; ")


def why(entry):
    """The sentence behind a verdict (a bridge status, a trend): its reasons worded and joined."""
    text = ""
    for i, r in enumerate(entry.get("reasons") or []):
        text += (JOINED.get(r["code"], "; ") if i else "") + REASONS[r["code"]](r)
    return text


DESIGNS = {  # compare.design's code -> what the runs are, with the question they answer
    "not_logged": lambda k: "no run has logged yet: the design shows once runs exist",
    "from_scratch": lambda k: "every run trained from scratch: does the variant, trained the whole budget, beat the "
                              "baseline?",
    "forked": lambda k: f"forked at step {k} from a shared baseline trunk per seed: does switching to the variant for "
                        f"the rest of the budget, after {k} steps of the baseline, beat continuing the baseline?"}


def design_text(report):
    """What a report's runs are (its design_code and fork_at)."""
    return DESIGNS[report["design_code"]](report.get("fork_at"))


def grown_text(look):
    added = look.get("added")
    return (f"; runs were added after a look ({', '.join(added['runs'])} after {added['looks_before']} look(s))"
            if added else "")


LOOKS = {  # compare.sequential_alpha's code -> the look a report is and the alpha its verdicts test at
    "planned_look": lambda c: f"look {c['number']} of the {len(c['planned'])} declared before the runs (at "
                              f"{c['planned']} seeds): family-wise alpha {c['spent']:.3g} spent here of "
                              f"{c['alpha']:g} (O'Brien-Fleming-type spending, looks combined by Bonferroni, which is "
                              f"conservative)",
    "off_plan": lambda c: f"NOT AT NOMINAL ALPHA: looks at {c['looks']} seeds, but the plan declared looks at "
                          f"{c['planned']}; the verdicts test at {c['alpha']:g} as if this were the only look"
                          f"{grown_text(c)}",
    "unplanned_looks": lambda c: f"NOT AT NOMINAL ALPHA: {len(c['looks'])} looks (reports at {c['looks']} seeds) and "
                                 f"no group-sequential plan; the verdicts test at {c['alpha']:g} as if this were the "
                                 f"only look, so their family-wise error is larger (up to about {len(c['looks'])} x "
                                 f"{c['alpha']:g}){grown_text(c)}. Declare `looks` in the suite before growing it",
    "before_first_look": lambda c: f"no look yet: the first of the {len(c['planned'])} declared before the runs is at "
                                   f"{c['planned'][0]} seeds, and no test is read before it",
    "one_look": lambda c: f"one look, at {c['seeds']} seeds: family-wise alpha {c['alpha']:g}{grown_text(c)}"}


def sequential_text(look):
    return LOOKS[look["code"]](look)


def runs_of_designs(m):
    return "; ".join(f"{', '.join(d['runs'][:3])}{' ...' if len(d['runs']) > 3 else ''} "
                     f"{'forked at step %d' % d['fork_at'] if d['fork_at'] is not None else 'from scratch'}"
                     for d in m["designs"])


MEASUREMENT = {  # compare.measurement_problems' code -> why the metric is not measured alike
    "data_changed": lambda m: f"{', '.join(m['keys'])}: {m['run']} resumed on changed data (allow_data_change)",
    "designs": lambda m: f"design: {runs_of_designs(m)}: runs of different designs answer different questions and "
                         f"are never pooled",
    "recipe": lambda m: f"recipe: {m['run']} has {m['key']}={m['value']!r}, {m['other']} {m['other_value']!r}",
    "differs": lambda m: f"{m['key']}: {m['run']} has {m['value']!r}, {m['other']} {m['other_value']!r}",
    "seed_mismatch": lambda m: f"seed: {m['run']} is filed as seed {m['seed']} but its config.json says seed "
                               f"{m['config_seed']} (a copied run directory?): it is not a seed of its own",
    "duplicate_seed": lambda m: f"duplicated seed: {m['run']} started from the same weights on the same batches as "
                                f"{m['other']} (run_info.json): a copy counts as no second seed"}


def measurement_text(m):
    return MEASUREMENT[m["code"]](m)


def non_finite_text(m):
    return f"{m['file']}: {m['metric']} is {m['value']} at {m['tokens']} tokens"


PAIRING = {"no_run_info": lambda p: "no run_info.json: pairing cannot be checked",
           "data_order": lambda p: "different data order",
           "init_weights": lambda p: f"{p['differ']} of {p['shared']} shared weight tensors start from other values "
                                     f"(e.g. {p['example']})"}


def pairing_text(check):
    """One seed's pairing check (compare.pairing)."""
    if not check["paired"]:
        return f"seed {check['seed']}: no baseline run of this seed"
    return f"seed {check['seed']}: " + ("; ".join(PAIRING[p["code"]](p) for p in check["problems"]) or "holds")


def missing_text(missing):
    """The seeds with no run ending at the equal-FLOPs point (compare.compute_matched)."""
    return ", ".join(f"{m['seed']} (its run ended at {m['closest']:,} tokens)" if m["closest"] is not None
                     else m["seed"] for m in missing)


def unreliable_text(u):
    return f"{u['run']} (step times spread x{u['spread']:.2f})"


HOLDS = {  # ladder.lr_check's code -> whether the rule's learning rate holds at a size
    "yes": lambda row: "yes",
    "incomplete": lambda row: f"incomplete: {', '.join(f + 'x' for f in row['missing'])} not finished",
    "diverged": lambda row: "no: 1x diverged",
    "beaten": lambda row: f"no: {row['best']} is better by {row['by']:.3g}"}


def holds_text(row):
    return HOLDS[row["holds"]](row)


# every code the engine emits, by what it words: tests/test_render.py checks the engine emits no other
CODES = dict(reasons=REASONS, lr_failing=LR_FAILING, designs=DESIGNS, looks=LOOKS, measurement=MEASUREMENT,
             pairing=PAIRING, holds=HOLDS, answer_sources=ANSWER_SOURCES)


WORDED = {"design_code": ("design", design_text), "look": ("sequential", lambda r: sequential_text(r["look"])),
          "measurement_problems": ("measurement", lambda r: [measurement_text(m) for m in r["measurement_problems"]])}


def with_words(data):
    """report.json for readers: the data as computed, and after each verdict's (status's, trend's) reasons
    its `why`, after the design code its `design`, after the look its `sequential`, after the measurement
    problems their `measurement`, all worded here."""
    if isinstance(data, list):
        return [with_words(x) for x in data]
    if not isinstance(data, dict):
        return data
    out = {}
    for key, value in data.items():
        out[key] = value if key == "reasons" else with_words(value)
        if key == "reasons" and isinstance(value, list):
            out["why"] = why(data)
        if key in WORDED and value is not None:
            name, word = WORDED[key]
            out[name] = word(data)
    return out


# ----------------------------------------------------------------------------- the seed plan and a ladder's plan

def describe_plan(plan):
    if plan.get("analysis") == "blocked":
        return describe_blocked_plan(plan)
    if plan.get("per_variant"):
        return describe_variant_plan(plan)
    return describe_one_plan(plan)


def describe_variant_plan(plan):
    """A plan per variant: each variant's sd, its bound and what the planned seeds detect for it; the
    seeds min_effect needs at the noisiest variant's bound; the variants the pilot had no sd for."""
    level = plan["level"]
    lines = [f"per variant: its own paired-difference sd and n - 1 df (variants share each seed's baseline run, so "
             f"their differences are correlated and are not pooled), planned with its {pct(plan['sd_confidence'])} "
             f"upper confidence bound; {plan['comparisons']} comparison(s) at family-wise alpha {plan['alpha']:g} "
             f"(each at {level:.3g}), 80% power, {plan['seeds']} seeds:"]
    for name, p in plan["per_variant"].items():
        if not p["sd"]:
            lines.append(f"  {name}: sd 0 ({p['df']} df): the differences do not vary; compare the code paths")
            continue
        lines.append(f"  {name}: sd {p['sd']:.4g} ({p['df']} df), bound {p['sd_upper']:.4g}: detects "
                     + (f"{p['detectable']:.3g} at the bound ({p['detectable_at_sd']:.3g} at the sd)"
                        if p["detectable"] else "nothing with so few seeds")
                     + (f"; min_effect {p['min_effect']:g} needs {p['seeds_needed'] or 'more than %d' % stats.MOST_SEEDS} seeds"
                        if p["min_effect"] else ""))
    if not plan["sd_upper"]:
        lines.append("no planned variant's differences vary: no seed count follows from them")
    else:
        lines.append(f"the plan covers the noisiest, {plan['noisiest']} (bound {plan['sd_upper']:.4g})"
                     + (f": min_effect {plan['min_effect']:g} needs {plan['seeds_needed']} seeds"
                        if plan["min_effect"] and plan["seeds_needed"] else ""))
    lines += plan_warnings(plan, "no two paired seeds to take an sd from")
    return "\n".join(lines)


def plan_warnings(plan, why_unplanned):
    """A plan's closing lines: the variants it could not plan (and why), and a plan too small for min_effect."""
    lines = []
    if plan["unplanned"]:
        lines.append(f"unplanned: {', '.join(plan['unplanned'])} ({why_unplanned}: their noise is unknown, and "
                     f"the plan does not cover them)")
    if plan["underpowered"]:
        lines.append(f"warning: underpowered: {plan['seeds']} planned seeds cannot reliably detect "
                     f"{plan['min_effect']:g} in {plan['noisiest']}; plan {plan['seeds_needed'] or 'far more'} or "
                     f"declare a larger min_effect")
    return lines


def describe_blocked_plan(plan):
    """The blocked analysis's plan (stats.plan_blocked): per-arm sds and their bounds, and what the planned seeds
    detect with the analysis's own df and simultaneous critical value."""
    lines = [f"the blocked analysis's own df and critical value: per-arm sds from the table's block-adjusted residuals "
             f"({plan['df']} df each), planned with their {pct(plan['sd_confidence'])} upper confidence bounds; "
             f"{plan['comparisons']} many-to-one comparison(s) at family-wise alpha {plan['alpha']:g}, 80% power, "
             f"{plan['seeds']} seeds"
             + (f" ({plan['family_df']:.3g} df, the multivariate t's critical |t| {plan['critical']:.3g} at the bounds):"
                if plan.get("family_df") else ":"),
             f"  baseline: sd {plan['baseline_sd']:.4g}, bound {plan['baseline_sd_upper']:.4g} (its variance enters "
             f"every comparison)"]
    for name, p in plan["per_variant"].items():
        lines.append(f"  {name}: sd {p['sd']:.4g}, bound {p['sd_upper']:.4g}: detects "
                     + (f"{p['detectable']:.3g} at the bounds ({p['detectable_at_sd']:.3g} at the sds)"
                        if p["detectable"] else "nothing with so few seeds"))
    if plan["min_effect"]:
        lines.append(f"min_effect {plan['min_effect']:g} needs "
                     + (f"{plan['seeds_needed']} seeds" if plan["seeds_needed"] else "more seeds than the planner "
                        "searches") + f" in every variant at the bounds (the noisiest: {plan['noisiest']})")
    lines += plan_warnings(plan, "not in the pilot's table")
    return "\n".join(lines)


def describe_one_plan(plan):
    if not plan["sd"]:
        return (f"paired-difference sd 0 ({plan['df']} df): the differences do not vary, so no seed count follows "
                f"from them; compare the code paths")
    lines = [f"paired-difference sd {plan['sd']:.4g} ({plan['df']} df, pooled over the comparisons); planned with its "
             f"{pct(plan['sd_confidence'])} upper confidence bound {plan['sd_upper']:.4g}; {plan['comparisons']} "
             f"comparison(s) at family-wise alpha {plan['alpha']:g} (each at {plan['level']:.3g}), 80% power:"]
    if plan["detectable"]:
        lines.append(f"  {plan['seeds']} seeds detect effects of about {plan['detectable']:.3g} or more "
                     f"({plan['detectable_at_sd']:.3g} if the sd were exactly {plan['sd']:.4g})")
    else:
        lines.append(f"  {plan['seeds']} seed(s): too few to detect anything")
    if plan["min_effect"]:
        lines.append(f"  detecting min_effect {plan['min_effect']:g} needs {plan['seeds_needed']} seeds"
                     if plan["seeds_needed"] else
                     f"  detecting min_effect {plan['min_effect']:g} needs more than {stats.MOST_SEEDS:,} seeds")
    if plan["underpowered"]:
        lines.append(f"warning: underpowered: {plan['seeds']} planned seeds cannot reliably detect "
                     f"{plan['min_effect']:g}; plan {plan['seeds_needed'] or 'far more'} or declare a larger min_effect")
    return "\n".join(lines)


def ladder_plan_lines(plan):
    """sweep.py --plan for a ladder (ladder.plan): its span, steps, extrapolation limit, detectable slope."""
    lines = [f"ladder: {plan['sizes']} sizes spanning {plan['span']:.2f} e-folds of N ({plan['smallest']:,} to "
             f"{plan['largest']:,}); "
             + ("the same optimizer steps at every size (tokens fixed: does the effect at this budget change with N?)"
                if plan["same_steps"] else
                "steps x " + ", ".join(f"{n} {f:.3g}" for n, f in plan["steps"].items()) + " of the recipe's (size "
                "confounded with training length)")
             + f"; interval no further than N = {plan['limit']:,.0f} (one ladder width past the largest)"]
    if plan["sd"]:
        found = plan["slope"]
        lines.append(f"  trend test (a line per seed, t over {plan['seeds']} seeds) at level {plan['level']:.3g} "
                     f"({plan['alpha']:g} over {plan['comparisons']} variants), paired-difference sd {plan['sd']:g} at "
                     f"every size (declared), sizes independent: 80% power at a slope of "
                     + (f"{found:.3g} nats per e-fold of N ({found * plan['span']:.3g} across the ladder), simulated"
                        if found else "none within reach"))
    else:
        lines.append("  no ladder sd declared (ladder['sd'], a pilot's paired-difference sd): no detectable slope to plan")
    return lines


def compute_lines(compute):
    """sweep.py --plan for a ladder: its training compute and GPU-hours (ladder.training_compute)."""
    return [f"compute (6 N D, non-embedding N): {compute['flops']:.3g} FLOPs, about {compute['hours']:,.0f} H100 "
            f"GPU-hours at {compute['mfu']:.0%} MFU of {compute['peak_flops'] / 1e12:.0f} TFLOP/s (assumed; time a "
            f"pilot for the real rate): "
            + "; ".join(f"n_layer={s['n_layer']}, n_embd={s['n_embd']}: {s['hours']:,.0f} h" for s in compute["by_size"])]


def data_missing_line(problem):
    """sweep.py --plan before the data is prepared: the plan goes on, the runs would not start."""
    return f"data: NOT READY, the runs would stop at start-up: {problem}"


def measured_time_line(estimate):
    """sweep.py --plan without a pilot: the suite's time from a measured step of each variant, or why
    none was measured (sweep.measured_plan_time's code)."""
    if estimate["code"] == "several_processes":
        return f"time: not measured (runs of {estimate['nproc']} processes each); time a pilot (--pilot)"
    if estimate["code"] == "too_large_for_cpu":
        return (f"time: not measured: a micro-batch of {estimate['run']} is {estimate['flops']:.2g} training FLOPs, "
                f"minutes on a CPU (more than {estimate['limit']:.0e}); plan on the machine that trains, or time a "
                f"pilot (--pilot)")
    threads = f", {estimate['threads']} thread(s) each" if estimate["threads"] else ""
    return (f"time: about {estimate['wall_s'] / 60:.1f} min for {estimate['runs']} runs, {estimate['slots']} at a "
            f"time{threads} (a measured step of each variant x its iterations, not a pilot: evaluation and "
            f"start-up not counted); step " + ", ".join(f"{v} {s:.3g} s" for v, s in estimate["step_s"].items()))
