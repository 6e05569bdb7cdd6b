"""Provenance (issue 58): no committed report or doc names a directory of the machine that ran it; a
report names its runs relative to its suite directory and a declaration its files relative to the
repository, while older absolute paths are still read (a suite resumes, a report is rebuilt)."""
import json
import os
import re
import shutil

import pytest

import runtime
from ablation import compare, suites
from configurator import ConfigError

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
    for folder in ("reports", "docs"):
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
