"""runrecord: the code version covers what a run reads (tracked changes and untracked Python files:
a new config, suite or module), and the recorded patch restores that code."""
import os
import subprocess

import runrecord


def git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


def test_an_untracked_config_changes_the_code_version_and_the_patch_restores_it(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / ".gitignore").write_text("out*/\n")
    (repo / "train.py").write_text("print('train')\n")
    git(repo, "add", ".")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "first")
    commit, clean = runrecord.git_state(str(repo))
    assert clean == ""
    (repo / "out-run").mkdir()
    (repo / "out-run" / "ignored.py").write_text("x = 1\n")  # ignored: a run directory, not code
    (repo / "notes.txt").write_text("not code\n")
    assert runrecord.git_state(str(repo)) == (commit, "")
    # committed run records and reports are written as a suite goes on, never read as code
    (repo / "runs" / "suite").mkdir(parents=True)
    (repo / "runs" / "suite" / "launches.jsonl").write_text("{}\n")
    (repo / "reports").mkdir()
    (repo / "reports" / "tool.py").write_text("x = 1\n")
    git(repo, "add", "runs", "reports")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "records")
    commit = git(repo, "rev-parse", "HEAD").strip()
    (repo / "runs" / "suite" / "launches.jsonl").write_text("{}\n{}\n")
    (repo / "runs" / "suite" / "new.py").write_text("y = 2\n")
    (repo / "reports" / "tool.py").write_text("x = 2\n")
    assert runrecord.git_state(str(repo)) == (commit, "")
    (repo / "config").mkdir()
    (repo / "config" / "train_new.py").write_text("qk_norm = True\n")
    _, diff = runrecord.git_state(str(repo))
    assert "config/train_new.py" in diff and "ignored.py" not in diff and "notes.txt" not in diff
    (repo / "config" / "train_new.py").write_text("qk_norm = False\n")  # edited: another code version
    assert runrecord.git_state(str(repo))[1] != diff
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(repo), str(clone))
    (tmp_path / "patch").write_text(diff)
    git(clone, "apply", str(tmp_path / "patch"))
    assert (clone / "config" / "train_new.py").read_text() == "qk_norm = True\n"
