"""lm-evaluation-harness results kept in run directories, read back without lm-eval installed.

lm_eval_run.py writes each evaluation of a run into out_dir/lm_eval/: results_<date>.json (lm-eval's
aggregated scores) and samples_<task>_<date>.jsonl (one line per item: its doc_id, the model's
responses and the item's metrics), so two variants can be compared on the same items. The ablation
report pools each variant's task scores over its seeds.
"""
import json
import math
import os

RESULTS_DIR = "lm_eval"


def read_results(out_dir):
    """{task: {metric: value}} of the newest lm-eval result of each task in out_dir/lm_eval (lm-eval's
    'acc,none' keys read as 'acc', 'acc_stderr,none' as 'acc_stderr'), and {task: items evaluated}."""
    scores, counts = {}, {}
    directory = os.path.join(out_dir, RESULTS_DIR)
    if not os.path.isdir(directory):
        return scores, counts
    # lm-eval names the files by ISO date: in name order, a newer result of a task replaces an older one
    for name in sorted(f for f in os.listdir(directory) if f.startswith("results_") and f.endswith(".json")):
        try:
            with open(os.path.join(directory, name), encoding="utf-8") as f:
                result = json.load(f)
        except (UnicodeDecodeError, ValueError):
            continue  # a torn results file is no result
        for task, metrics in result.get("results", {}).items():
            scores[task] = {key.split(",")[0]: value for key, value in metrics.items()
                            if "," in key and isinstance(value, (int, float)) and math.isfinite(value)}
            counts[task] = result.get("n-samples", {}).get(task, {}).get("effective")
    return scores, counts


def pooled_task_scores(out_dirs):
    """{task: {metric: dict(value, ci95, seeds, runs, n)}} over the runs (seeds) of one variant: the
    mean over the `seeds` evaluated out of `runs`, with a Student-t 95% interval over seeds; with one
    seed, lm-eval's own interval (value +- 1.96 stderr over items). Only tasks and metrics that every
    evaluated run has are pooled; a task whose runs scored different numbers of items (another
    --limit) is not pooled: {task: {'refused': why}}, since a mean over different items means nothing."""
    from scipy import stats
    per_run = [read_results(d) for d in out_dirs]
    per_run = [(scores, counts) for scores, counts in per_run if scores]
    if not per_run:
        return {}
    tasks = set.intersection(*(set(scores) for scores, _ in per_run))
    pooled = {}
    for task in sorted(tasks):
        items = sorted({counts.get(task) for _, counts in per_run}, key=str)
        if len(items) > 1:
            pooled[task] = dict(refused=f"its seeds scored different numbers of items ({', '.join(map(str, items))}): "
                                        f"evaluate every seed on the same items (the same --limit)")
            continue
        metrics = set.intersection(*(set(scores[task]) for scores, _ in per_run))
        pooled[task] = {}
        for metric in sorted(m for m in metrics if not m.endswith("_stderr")):
            values = [scores[task][metric] for scores, _ in per_run]
            mean = sum(values) / len(values)
            if len(values) > 1:
                half = stats.t.ppf(0.975, len(values) - 1) * stats.tstd(values) / math.sqrt(len(values))
            else:
                half = 1.96 * per_run[0][0][task].get(f"{metric}_stderr", float("nan"))
            ci = [mean - half, mean + half] if math.isfinite(half) else None
            pooled[task][metric] = dict(value=mean, ci95=ci, seeds=len(values), runs=len(out_dirs),
                                          n=per_run[0][1].get(task))
    return pooled


def report_lines(report):
    """The ablation report's section of lm-eval task scores per variant (report['variants'][v]['lm_eval'])."""
    tasks = [(variant, task, metrics) for variant, v in report["variants"].items()
             for task, metrics in v.get("lm_eval", {}).items()]
    if not tasks:
        return []
    lines = ["", "## lm-evaluation-harness tasks (out_dir/lm_eval; mean over the seeds evaluated, Student-t 95% "
                 "over seeds, one seed: lm-eval's own interval over items)", "",
             "| variant | task | metric | seeds | items | value | 95% interval |", "|---|---|---|---|---|---|---|"]
    refused = []
    for variant, task, metrics in tasks:
        if "refused" in metrics:
            refused.append(f"- {variant} / {task}: not pooled, {metrics['refused']}")
            continue
        for metric, s in metrics.items():
            ci = f"[{s['ci95'][0]:.4f}, {s['ci95'][1]:.4f}]" if s["ci95"] else "-"
            lines.append(f"| {variant} | {task} | {metric} | {s['seeds']} of {s['runs']} | "
                         f"{s['n'] if s['n'] is not None else '-'} | {s['value']:.4f} | {ci} |")
    return lines + ([""] + refused if refused else [])
