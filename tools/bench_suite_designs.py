"""Seeds per hour of the RA twin's two designs, side by side in one sitting on this machine.

    python tools/bench_suite_designs.py                       # 2 seeds of each design, both cores busy
    python tools/bench_suite_designs.py --seeds=1,2,3 --out=out-bench-suite

Every run from scratch (suites/ra_shakespeare.py with --cpu_runs=2), against warmup-and-fork
(suites/ra_shakespeare_forked.py: one trunk per seed, five branches of half the budget, evaluation only
at the fork and at the end; for RA the fork's own question, since RA has no function-preserving start). Each design runs as `python sweep.py`
does for a user, one after the other in fresh suite directories; the table gives each one's wall
time, seconds per seed and seeds per hour, and the ratio to today's path. Resolution per seed
differs between the designs (the noise budget in docs/ablation.md): seeds per hour is the cost side.
"""
import json
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)  # a tool imports the workbench's modules from the repository root

import configurator  # noqa: E402
import rundir  # noqa: E402

OPTIONS = dict(
    seeds="1,2",  # the seeds each design runs
    out="out-bench-suite",  # where the two suite directories and bench_suite.json go (a new directory, or one this tool wrote: its files removed first)
)
DESIGNS = (("from scratch (--cpu_runs=2)", "suites/ra_shakespeare.py", ["--cpu_runs=2"]),
           ("warmup-and-fork", "suites/ra_shakespeare_forked.py", []))


def run_design(suite, extra, seeds, sweep_dir):
    if os.path.exists(sweep_dir):  # left by a bench killed mid-way: its finished runs would be skipped, not timed
        raise rundir.RunDirError(f"{sweep_dir} exists but is not among the files this tool listed as its own (a "
                                 f"bench killed mid-way?): nothing was deleted; move it away or choose a new --out")
    started = time.perf_counter()
    done = subprocess.run([sys.executable, os.path.join(REPO, "sweep.py"), os.path.join(REPO, suite),
                           f"--seeds={seeds}", f"--sweep_dir={sweep_dir}", *extra], cwd=REPO,
                          capture_output=True, text=True)
    if done.returncode:
        raise configurator.ConfigError(f"{suite} failed: {(done.stderr or done.stdout).strip().splitlines()[-1]}")
    return time.perf_counter() - started, len([d for d in os.listdir(sweep_dir)
                                               if os.path.isdir(os.path.join(sweep_dir, d))])


def main(argv):
    options, extra = configurator.options_and_paths(argv, OPTIONS, text_keys=("seeds",))
    if extra:
        raise configurator.ConfigError(f"{extra[0]!r}: tools/bench_suite_designs.py takes only --key=value options (--help)")
    seeds = [s.strip() for s in str(options["seeds"]).split(",")]
    if not all(s.isdigit() for s in seeds) or len(set(seeds)) != len(seeds):
        raise configurator.ConfigError(f"--seeds={options['seeds']!r}: distinct integers >= 0, comma-separated")
    n = len(seeds)
    with rundir.tool_output_dir(options["out"], "bench_suite_designs.py"):  # options validated first
        rows = []
        for label, suite, extra in DESIGNS:
            sweep_dir = os.path.abspath(os.path.join(options["out"], os.path.splitext(os.path.basename(suite))[0]))
            wall, runs = run_design(suite, extra, options["seeds"], sweep_dir)
            rows.append(dict(design=label, suite=suite, seeds=n, runs=runs, wall_s=wall, s_per_seed=wall / n,
                             seeds_per_hour=3600 * n / wall))
        write_table(rows, options)
    return 0


def write_table(rows, options):
    base = rows[0]["seeds_per_hour"]
    print(f"{os.cpu_count()} cores, seeds {options['seeds']}")
    print(f"{'design':<36} {'runs':>4} {'wall s':>8} {'s/seed':>8} {'seeds/h':>8} {'x today':>8}")
    for r in rows:
        print(f"{r['design']:<36} {r['runs']:>4} {r['wall_s']:>8.0f} {r['s_per_seed']:>8.0f} "
              f"{r['seeds_per_hour']:>8.1f} {r['seeds_per_hour'] / base:>8.2f}")
    with open(os.path.join(options["out"], "bench_suite.json"), "w") as f:
        json.dump(dict(cores=os.cpu_count(), rows=rows), f, indent=1)


if __name__ == "__main__":
    configurator.run_script(main, rundir.RunDirError)
