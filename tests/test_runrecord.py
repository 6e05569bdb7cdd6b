"""runrecord: the code version covers what a run reads (tracked changes and untracked Python files:
a new config, suite or module), and the recorded patch restores that code."""
import json
import os
import subprocess

import numpy as np

import runrecord
import tokendata


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


def test_the_same_data_elsewhere_has_the_same_fingerprint_and_other_data_another(tmp_path):
    """The dataset fingerprint follows the data, not the files' times: a copy prepared or touched at another
    moment (meta.json's token-id cache then holds other modification times) keeps it, so a suite's runs from
    two machines compare; other bytes or another meta.json entry change it."""
    dirs = []
    for name, mtime in (("here", 1_000_000_000), ("there", 1_700_000_000)):
        d = tmp_path / name
        d.mkdir()
        for split, n in (("train", 5000), ("val", 500)):
            np.arange(n, dtype=np.uint16).tofile(d / f"{split}.bin")
            os.utime(d / f"{split}.bin", ns=(mtime * 10**9, mtime * 10**9))
        (d / "meta.json").write_text(json.dumps(dict(vocab_size=5000, tokenizer="char")))
        tokendata.max_token_id(str(d))  # the cache written as a first run writes it
        dirs.append(d)
    assert json.loads((dirs[0] / "meta.json").read_text())["max_token_id"] != json.loads(
        (dirs[1] / "meta.json").read_text())["max_token_id"]
    assert runrecord.dataset_fingerprint(str(dirs[0])) == runrecord.dataset_fingerprint(str(dirs[1]))
    (dirs[1] / "meta.json").write_text(json.dumps(dict(vocab_size=5000, tokenizer="gpt2")))
    assert runrecord.dataset_fingerprint(str(dirs[0])) != runrecord.dataset_fingerprint(str(dirs[1]))
    np.arange(1, 501, dtype=np.uint16).tofile(dirs[0] / "val.bin")
    assert runrecord.dataset_fingerprint(str(dirs[0])) != runrecord.dataset_fingerprint(str(dirs[1]))
