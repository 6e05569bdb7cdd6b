"""report.py on committed run directories (a suite from scratch and a forked one, tiny toy runs) writes
the committed report.md and report.json byte for byte, the suite's own path aside: a move of the
engine's code cannot change a number or a word unnoticed. An intended change re-pins them:

    python tests/test_report_golden.py --write
"""
import json
import os
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(REPO, "tests", "fixtures", "report_suites")
GOLDEN = os.path.join(REPO, "tests", "golden", "reports")
SUITES = ("scratch", "forked")
FILES = ("report.md", "report.json")


def rebuilt_report(suite, work_dir):
    """{file name: text} of report.py run as a user runs it on a copy of the suite's directory, its path
    written as SUITE."""
    suite_dir = os.path.join(work_dir, suite)
    shutil.copytree(os.path.join(FIXTURES, suite), suite_dir)
    subprocess.run([sys.executable, os.path.join(REPO, "report.py"), suite_dir], cwd=REPO, check=True,
                   capture_output=True, env=dict(os.environ, MPLBACKEND="Agg"))
    return {name: open(os.path.join(suite_dir, name)).read().replace(suite_dir, "SUITE") for name in FILES}


@pytest.mark.parametrize("suite", SUITES)
def test_report_py_rebuilds_the_committed_report(suite, tmp_path):
    rebuilt = rebuilt_report(suite, str(tmp_path))
    for name in FILES:
        with open(os.path.join(GOLDEN, f"{suite}.{name}")) as f:
            assert rebuilt[name] == f.read(), f"{suite}/{name} changed: if intended, re-pin (see this file's docstring)"


def plain_word(verdict):
    """What a headline sentence says in bold for a table verdict (an independent reading, not render's code)."""
    if verdict.startswith(("better", "worse")):
        return verdict.split(",")[0]
    return {"equivalent": "equivalent", "inconclusive": "cannot be told from the baseline"}.get(verdict, "no answer")


@pytest.mark.parametrize("suite", SUITES)
def test_the_headline_the_table_and_the_why_lines_give_each_variant_the_same_answer(suite, tmp_path):
    import re
    rebuilt = rebuilt_report(suite, str(tmp_path))
    text, data = rebuilt["report.md"], json.loads(rebuilt["report.json"])
    head = text.split("## ")[0]
    table = {m[0]: m[1] for m in re.findall(r"^\| (\S+) \| \*\*([^*]+)\*\*", text, re.M)}
    why = {m[0]: m[1] for m in re.findall(r"^- \*\*(\S+)\*\* \([^)]*\): ([^:]+):", text.split("## Why each verdict")[1], re.M)}
    said = {m[0]: m[1] for m in re.findall(r"^- \*\*(\S+)\*\*, [^:]+: (?:is |has )?\*\*([^*]+)\*\*", head, re.M)}
    variants = [v for v in table if table[v] != "baseline"]
    assert variants and set(said) == set(variants) <= set(why)
    for v in variants:
        assert why[v] == table[v] and said[v] == plain_word(table[v]), (v, said[v], table[v], why[v])
    # both fixtures' runs record no tuning (lr_tuning '') and their suites declare none: the headline says untuned
    assert data["tuning"] is None and data["about"]["lr_tuning"] == ""
    assert "How far it carries:" in head and "at learning rate 0.003 (**untuned**)" in head


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/test_report_golden.py --write   (re-pins the committed reports)")
    import tempfile
    with tempfile.TemporaryDirectory() as work_dir:
        for suite in SUITES:
            for name, text in rebuilt_report(suite, work_dir).items():
                with open(os.path.join(GOLDEN, f"{suite}.{name}"), "w") as f:
                    f.write(text)
