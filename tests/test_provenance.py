"""Provenance (issue 58): no committed report or doc names a directory of the machine that ran it; a
report names its runs relative to its suite directory and a declaration its files relative to the
repository, while older absolute paths are still read (a suite resumes, a report is rebuilt)."""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import pytest

import rundir
import runrecord
import runtime
import sweep
from ablation import compare, suites
from configurator import ConfigError
from helpers import run_script, tiny_args

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the home, work and temporary directories of the machines that ran things (a system tool's /usr/bin is no one's)
MACHINE_PATH = re.compile(r"(?<![\w.~-])/(?:work|home|tmp|Users|root|mnt|scratch|private|var/folders)/")
TEXT = (".md", ".json", ".jsonl", ".txt", ".csv", ".py")


def machine_paths(folder):
    """['file:line: text'] of every line under folder (text files) that names a machine's directory."""
    found = []
    for root, _, files in os.walk(os.path.join(REPO, folder)):
        for name in sorted(files):
            if name.endswith(TEXT):
                path = os.path.join(root, name)
                for number, line in enumerate(open(path, encoding="utf-8", errors="replace"), 1):
                    if MACHINE_PATH.search(line):
                        found.append(f"{os.path.relpath(path, REPO)}:{number}: {line.strip()[:120]}")
    return found


def test_no_committed_report_or_doc_names_a_directory_of_the_machine_that_ran_it():
    assert MACHINE_PATH.search('"config": ["/work/flag3/config/train_ra_baseline.py"]')
    assert MACHINE_PATH.search("| 1 | /Users/me/out-suite-x/base-seed1 |") and not MACHINE_PATH.search("/usr/bin/time")
    for folder in ("reports", "docs", "runs"):
        assert machine_paths(folder) == [], "write paths relative to the repository or the suite directory"


def test_a_report_names_its_runs_relative_to_its_suite_directory(tmp_path):
    """Rebuilt from an absolute suite directory (as a sweep_dir given absolute, the ladder's was), the
    report names no part of that directory."""
    suite_dir = str(tmp_path / "elsewhere" / "scratch")
    shutil.copytree(os.path.join(REPO, "tests", "fixtures", "report_suites", "scratch"), suite_dir)
    suites.report_suite_dir(suite_dir)
    runs = json.load(open(os.path.join(suite_dir, "report.json")))["variants"]["base"]["runs"]
    assert {s: r["out_dir"] for s, r in runs.items()} == {f"seed{s}": f"base-seed{s}" for s in (1, 2, 3)}
    for name in ("report.md", "report.json"):
        assert str(tmp_path) not in open(os.path.join(suite_dir, name)).read(), name
    one = {("base", 1): dict(out_dir=os.path.join(suite_dir, "base-seed1"))}
    assert compare.relative_dirs(one) == {("base", 1): "base-seed1"}  # one run: its own name


def test_a_tuning_is_declared_relative_to_the_repository_and_an_older_absolute_one_still_reads():
    path = os.path.join(REPO, "reports", "tune_ra_shakespeare_scratch", "tuning.json")
    declared = suites.tuning_facts(path)
    assert declared["path"] == os.path.join("reports", "tune_ra_shakespeare_scratch", "tuning.json")
    stale = dict(declared, best_factors={"late": 2.0}, summary="before the variants' check")  # refreshed from the file
    assert suites.current_tuning(stale)["summary"] == declared["summary"] != stale["summary"]
    assert suites.current_tuning(stale)["best_factors"] == declared["best_factors"]
    older = dict(stale, path=path)  # a suite.json written before paths were relative
    assert suites.current_tuning(older)["summary"] == declared["summary"]


def declared_suite(**more):
    namespace = dict(variants={"base": {}, "low": {"learning_rate": 1e-4}}, baseline="base", seeds=[1, 2, 3],
                     metric="val_loss", allowed=["learning_rate"], **more)
    return suites.read_suite(namespace, "toy", REPO, runtime.DEFAULTS)


def test_a_report_counts_the_earlier_recipes_tried_on_its_question_as_looks(tmp_path):
    """A suite may name the recipes tried on the same question before it (`earlier`): frozen with the
    declaration, and the report's header says this is look n + 1 at the question, not one look."""
    earlier = ["1,000 steps at 3e-3, 3 seeds (reports/ra_shakespeare_scratch)", "wsd schedule, seeds 931-934"]
    assert declared_suite(earlier=earlier)["earlier"] == earlier and declared_suite()["earlier"] is None
    for bad in ("one recipe", [""], [3]):
        with pytest.raises(ConfigError, match=r"^earlier="):
            declared_suite(earlier=bad)
    suite_dir = str(tmp_path / "scratch")
    shutil.copytree(os.path.join(REPO, "tests", "fixtures", "report_suites", "scratch"), suite_dir)
    path = os.path.join(suite_dir, "suite.json")
    declared = json.load(open(path))
    with open(path, "w") as f:
        json.dump(dict(declared, earlier=earlier), f)
    suites.report_suite_dir(suite_dir)
    assert json.load(open(os.path.join(suite_dir, "report.json")))["earlier_recipes"] == earlier
    text = open(os.path.join(suite_dir, "report.md")).read()
    assert f"Earlier recipes on the same question: 2 ({earlier[0]}; {earlier[1]})" in text and "look 3 at it" in text
    with pytest.raises(ConfigError, match="declared earlier="):  # never rewritten after the runs
        suites.check_declaration(dict(declared, earlier=earlier[:1]), suite_dir)


def test_a_run_records_its_paths_relative_to_the_repository_and_an_older_record_is_made_so(data_dir, capsys):
    """A run started from the repository's root with a config file and data inside it records no directory
    of the checkout (run_info.json's working directory, command and repeat line, the checklist's data_dir);
    tools/portable_runs.py turns a record written before that into the same record, and leaves it alone after."""
    work = tempfile.mkdtemp(prefix="out-provenance-", dir=REPO)  # out*/ is ignored by git
    try:
        data, out = os.path.join(work, "data"), os.path.join(work, "run")
        shutil.copytree(data_dir, data)
        config = os.path.join(REPO, "config", "train_ra_baseline.py")
        subprocess.run([sys.executable, os.path.join(REPO, "train.py"), config, *tiny_args(data, out, "--max_iters=1", "--compile=False", "--wandb_log=False")],
                       cwd=REPO, check=True, capture_output=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
        info = json.load(open(os.path.join(out, "run_info.json")))
        log = open(os.path.join(out, "log.jsonl")).readlines()
        assert REPO not in json.dumps(info) and REPO not in "".join(log)
        work_rel = os.path.relpath(work, REPO)
        assert info["start"]["cwd"] == "."
        assert info["start"]["command"].startswith(f"python train.py config/train_ra_baseline.py --data_dir={work_rel}/data")
        repeat = info["repeat"]  # from the repository's root (a dirty tree's patch applied between)
        assert repeat.startswith(f"git checkout {info['start']['commit']} && ") and " cd " not in repeat
        assert repeat.endswith(f" && {info['start']['command']}")
        assert json.loads(log[0])["data_dir"] == f"{work_rel}/data"

        older = dict(info, start=dict(info["start"], cwd=REPO, command=info["start"]["command"].replace(
            "train.py config/", f"{REPO}/train.py {REPO}/config/").replace(f"={work_rel}", f"={work}")))
        older["repeat"] = f"cd {REPO} && git checkout {info['start']['commit']} && cd {REPO} && {older['start']['command']}"
        json.dump(older, open(os.path.join(out, "run_info.json"), "w"), indent=1)
        open(os.path.join(out, "log.jsonl"), "w").writelines(
            [json.dumps(dict(json.loads(log[0]), data_dir=data)) + "\n", *log[1:]])
        assert run_script(capsys, "tools/portable_runs.py", work) == (0, "")
        assert json.load(open(os.path.join(out, "run_info.json"))) == info
        assert open(os.path.join(out, "log.jsonl")).readlines() == log
        older["repeat"] = "kept"  # a portable record is left as it is
        json.dump(older, open(os.path.join(out, "run_info.json"), "w"), indent=1)
        with rundir.out_dir_lock(out):  # a running run: refused, nothing rewritten
            code, err = run_script(capsys, "tools/portable_runs.py", work)
        assert code == 1 and "is in use by another run" in err
        assert run_script(capsys, "tools/portable_runs.py", out) == (0, "")
        assert json.load(open(os.path.join(out, "run_info.json")))["repeat"] == "kept"
    finally:
        shutil.rmtree(work)


def test_a_sweep_names_runs_that_trained_with_other_code_than_this_checkout(tmp_path, monkeypatch):
    """Runs carried from another checkout pool with runs made here across seeds, never within one: before it starts
    any run, the sweep names each other code version with its seeds, and a seed that has runs there and runs still
    to make here (their pairs would be refused), with how to finish it."""
    monkeypatch.setattr(runrecord, "git_state", lambda repo: ("c0ffee", ""))
    finished = json.dumps(dict(event="end", iter=4, tokens=10, stop_reason="max_iters")) + "\n"
    for name, versions in (("base-seed1", ["abc123"]), ("late-seed1", ["abc123"]), ("base-seed2", ["abc123"]),
                           ("base-seed3", ["c0ffee"])):
        os.makedirs(tmp_path / name)
        json.dump(dict(code_versions=versions), open(tmp_path / name / "run_info.json", "w"))
        (tmp_path / name / "log.jsonl").write_text(finished)
    (tmp_path / "late-seed2").mkdir()
    open(tmp_path / "late-seed2" / "run_info.json", "w").write("{damaged")
    names = ("base-seed1", "late-seed1", "base-seed2", "late-seed2", "base-seed3", "late-seed3")
    runs = [(name, dict(seed=int(name[-1])), []) for name in names]
    assert sweep.other_code_lines(runs, str(tmp_path)) == [
        f"note: 3 run(s) in {tmp_path} trained at code version abc123 (seeds 1-2), this checkout is c0ffee: runs made "
        f"here pool with them across seeds, and the report names each version's seeds; a pair across two versions is "
        f"refused. Seed 2 also has runs still to make, which would pair across versions: finish them at abc123 (git "
        f"worktree add DIR abc123, the run records copied in), or delete their runs there to make the seed again here"]
    assert sweep.other_code_lines(runs[4:], str(tmp_path)) == []
