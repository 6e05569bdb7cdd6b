"""Rebuild an ablation report from run directories alone: report.md, report.json and plots.

    python report.py out-suite-ra_shakespeare                # a suite directory (sweep.py wrote suite.json)
    python report.py out-a out-b-seed1 out-b-seed2 --metric=val_loss --baseline=out-a --out=out-report

A suite directory keeps the metric, baseline and allowed keys declared before its runs. Other run
directories are grouped into variants by their configs (seed, out_dir and run names aside); the
metric, the baseline and the keys allowed to differ are then given here (--allowed=k1,k2; without
it every config difference between the runs is treated as intended, and the report says so).
Measured confounds (data, evaluation windows, classes, dtype, device, versions) are checked either way.
"""
import os
import sys

import configurator
import rundir
from ablation import bridge, compare, render, suites

OPTIONS = dict(
    metric="val_loss",  # run directories only: one of compare.METRICS (a suite keeps its declared metric)
    baseline="",  # run directories only: a variant name or a directory ('' = the first directory's variant)
    allowed="",  # run directories only: comma-separated keys allowed to differ ('' = every difference)
    out="",  # where report.md goes ('' = the suite directory, or out-report for run directories)
    alpha=0.05,  # family-wise significance level (a suite keeps the one it declared)
    min_effect=0.0,  # smallest effect of interest in the metric's units; 0 = not declared (no equivalence verdict)
)


def plan_given(options):
    """The plan keys passed here, for a suite that declared none before its runs."""
    return {k: (options[k] or None) for k in ("alpha", "min_effect") if options[k] != OPTIONS[k]}


def main(argv):
    if any(a in configurator.HELP_FLAGS for a in argv):
        raise configurator.HelpRequested(OPTIONS)  # run_script prints this docstring and the options
    options, dirs = dict(OPTIONS), []
    for arg in argv:
        key, raw = configurator.split_arg(arg, OPTIONS)
        if key is None:
            dirs.append(arg)
        elif key in ("alpha", "min_effect"):
            options[key] = configurator.check_type(key, configurator.parse_value(raw), OPTIONS[key], arg)
        elif key in OPTIONS:
            options[key] = raw
        else:
            raise configurator.ConfigError(f"{arg!r}: the options are {', '.join('--' + k + '=' for k in OPTIONS)}")
    if not 0 < options["alpha"] < 1 or options["min_effect"] < 0:
        raise configurator.ConfigError("--alpha must lie in (0, 1) and --min_effect be >= 0")
    if not dirs:
        raise configurator.ConfigError("give a suite directory or run directories (python report.py --help)")
    if options["out"]:
        rundir.check_output_dir(options["out"])
        check_not_another_suite(options["out"], dirs)
    try:
        return build(options, dirs)
    except OSError as e:  # a full disk, a read-only suite directory or --out
        where = e.filename or options["out"] or dirs[0]
        raise rundir.RunDirError(rundir.describe_write_error(e, where, "the report is incomplete: free space, or "
                                                             "write it elsewhere with --out=DIR")) from None


def check_not_another_suite(out, dirs):
    """--out may be the reported suite's own directory, never another suite's: its report would be
    overwritten by this one."""
    own = [os.path.realpath(d) for d in dirs]
    if os.path.exists(os.path.join(out, "suite.json")) and own != [os.path.realpath(out)]:
        raise configurator.ConfigError(f"--out={out} is another suite's directory: writing there would overwrite its "
                                       f"report; choose a new --out")


def build(options, dirs):
    missing = [d for d in dirs if not os.path.isdir(d)]
    if missing:
        raise configurator.ConfigError(f"{missing[0]} is not a directory")
    if len(dirs) == 1 and os.path.exists(os.path.join(dirs[0], "suite.json")):
        if any(options[k] != OPTIONS[k] for k in ("metric", "baseline", "allowed")):
            raise configurator.ConfigError(f"{dirs[0]} is a suite: its metric, baseline and allowed keys were "
                                           f"declared before its runs and cannot be changed here")
        try:
            path = suites.report_suite_dir(dirs[0], options["out"] or None, plan_given(options))
        except ValueError as e:
            raise configurator.ConfigError(str(e)) from None
    else:
        allowed = [k for k in options["allowed"].split(",") if k] if options["allowed"] else None
        try:
            suite, runs = suites.suite_from_run_dirs(dirs, options["metric"], options["baseline"], allowed,
                                                       options["alpha"], options["min_effect"] or None)
        except ValueError as e:
            raise configurator.ConfigError(str(e)) from None
        path = render.write_report(bridge.add_to_report(compare.compare(suite, runs), runs), runs,
                                   options["out"] or "out-report")
    print(open(path).read())
    print(f"written: {path}", file=sys.stderr)
    return path


if __name__ == "__main__":
    configurator.run_script(main, rundir.RunDirError)
