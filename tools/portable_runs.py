"""Rewrite run records written before train.py recorded paths relative to the repository, so that they
name no directory of the machine that ran them and can be committed or carried to another checkout.

    python tools/portable_runs.py runs/ra_shakespeare_long     # every run directory below it
    python tools/portable_runs.py RUN_DIR [RUN_DIR ...]

An older run_info.json names its checkout (the directory its repeat line starts in) in each start's
working directory and command and in the repeat line; log.jsonl's checklist names the data directory.
They become what train.py writes now: paths inside that checkout relative to it (a data directory outside
it stays as recorded). Nothing else changes; a run already portable is left as it is, and a run that is
running (its lock is held) is refused before anything is rewritten. The text logs (log.txt, console.txt)
are copies for people and are not rewritten: leave them out of what you commit.
"""
import contextlib
import json
import os
import shlex
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)  # a tool imports the workbench's modules from the repository root

import configurator  # noqa: E402
import rundir  # noqa: E402
import runrecord  # noqa: E402

OPTIONS = dict()  # no keys: the paths are the whole input


def recorded_checkout(info):
    """The checkout an older record ran in: the directory its repeat line starts in, or None (a portable record)."""
    words = shlex.split(info.get("repeat") or "")
    return words[1] if len(words) > 3 and words[0] == "cd" and os.path.isabs(words[1]) and words[3] == "git" else None


def portable_checklist(line, checkout):
    """A log.jsonl line, its checklist's data_dir made relative to the checkout (every other line as it is)."""
    event = json.loads(line)
    if event.get("event") != "checklist":
        return line
    return json.dumps(dict(event, data_dir=rundir.in_repository(event["data_dir"], checkout))) + "\n"


def portable_run(out_dir):
    """Rewrite one run directory's records; returns the checkout they named, or None when already portable."""
    with open(os.path.join(out_dir, "run_info.json"), encoding="utf-8") as f:
        info = json.load(f)
    checkout = recorded_checkout(info)
    if checkout is None:
        return None
    info["start"] = runrecord.portable_start(info["start"], checkout)
    info["resumes"] = [runrecord.portable_start(start, checkout) for start in info["resumes"]]
    info["repeat"] = runrecord.repeat_command(out_dir, info["start"])
    log = os.path.join(out_dir, "log.jsonl")
    with open(log, encoding="utf-8") as f:
        lines = f.readlines()
    with rundir.atomic_write(log, "w") as f:
        f.writelines(portable_checklist(line, checkout) if '"checklist"' in line else line for line in lines)
    with rundir.atomic_write(os.path.join(out_dir, "run_info.json"), "w") as f:
        json.dump(info, f, indent=1)
    return checkout


def main(argv):
    _, paths = configurator.options_and_paths(argv, OPTIONS)
    if not paths:
        raise configurator.ConfigError("name a sweep directory or run directories (python tools/portable_runs.py --help)")
    runs = sorted({os.path.normpath(d) for path in paths for d, _, names in os.walk(path) if "run_info.json" in names})
    if not runs:
        raise configurator.ConfigError(f"no run directory (one with run_info.json) under {', '.join(paths)}: "
                                       f"name a sweep directory or run directories")
    with contextlib.ExitStack() as held:
        for d in runs:  # every run held before any is rewritten: a running one refuses the whole call
            held.enter_context(rundir.out_dir_lock(d))
        for d in runs:
            checkout = portable_run(d)
            print(f"{d}: {'already portable' if checkout is None else f'paths of {checkout} made relative to it'}")


if __name__ == "__main__":
    configurator.run_script(main, rundir.RunDirError)
