"""Every command README.md and docs/ print, checked as written: the script or file it runs exists,
every --key=value is a key that script takes, and the config and suite files it names exist.
(tests/test_configs.py also resolves every documented train.py command at its world size.)"""
import functools
import glob
import importlib
import os
import re
import shlex
import subprocess
import sys

import pytest

import runtime

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCUMENTS = ["README.md", *sorted(glob.glob("docs/*.md", root_dir=REPO))]
FOREIGN_OPTIONS = ("lm_eval_run.py",)  # hands its options to lm-eval's own command line


def candidate_lines(text):
    """Lines of code blocks, and the inline `code` of other lines."""
    inside = False
    for line in text.replace("\\\n", " ").splitlines():
        if line.lstrip().startswith("```"):
            inside = not inside
            continue
        yield from [line] if inside else re.findall(r"`([^`]+)`", line)


def documented_commands():
    """(document, command words) of every `python`, `torchrun` and `bash` command printed there."""
    found = []
    for document in DOCUMENTS:
        with open(os.path.join(REPO, document)) as f:
            text = f.read()
        for line in candidate_lines(text):
            line = re.sub(r"\s+#.*$", "", line.strip().removeprefix("$ "))
            for command in re.split(r"&&|\|\||;|\|", line):
                try:
                    words = shlex.split(command)
                except ValueError:
                    continue
                if words and words[0] in ("python", "torchrun", "bash") and len(words) > 1:
                    found.append((document, words))
    return found


def script_of(words):
    """(script path, its arguments), or None for a command that runs no file of ours."""
    if words[0] == "python" and words[1] == "-m":
        return None  # a library's module (pytest, pip)
    rest = [w for w in words[1:] if not (words[0] == "torchrun" and w.startswith("-"))]
    if not rest or not rest[0].endswith((".py", ".sh", ".sbatch")) or re.search(r"[<>]|\.\.\.|NAME|PATH", rest[0]):
        return None
    return rest[0], rest[1:]


@functools.cache
def keys_of(script):
    """The --key=value keys a script takes: its DEFAULTS or OPTIONS (train.py and sweep.py: the run's
    keys too), or for a script on argparse, the flags its --help lists."""
    module_name = script[:-3].replace("/", ".")
    module = importlib.import_module(module_name)
    keys = set()
    for name in ("DEFAULTS", "OPTIONS"):
        keys |= set(getattr(module, name, {}))
    if module_name in ("train", "sweep"):
        keys |= set(runtime.DEFAULTS)
    if not keys:
        out = subprocess.run([sys.executable, os.path.join(REPO, script), "--help"], cwd=REPO, capture_output=True,
                             text=True, timeout=120).stdout
        keys = set(re.findall(r"--(\w+)", out))
    return keys


COMMANDS = [(document, words) for document, words in documented_commands() if script_of(words)]


def test_the_documents_print_commands():
    scripts = {script_of(words)[0] for _, words in COMMANDS}
    assert {"train.py", "sweep.py", "report.py", "tools/noise_budget.py"} <= scripts, scripts


@pytest.mark.parametrize("document,words", COMMANDS, ids=lambda v: v if isinstance(v, str) else " ".join(v)[:80])
def test_a_documented_command_runs_a_file_that_takes_its_options(document, words):
    script, args = script_of(words)
    assert os.path.exists(os.path.join(REPO, script)), f"{document}: {script} does not exist"
    for arg in args:
        if arg.endswith(".py") and "/" in arg:  # a config or suite file
            assert os.path.exists(os.path.join(REPO, arg)), f"{document}: {arg} does not exist"
    if not script.endswith(".py") or os.path.basename(script) in FOREIGN_OPTIONS:
        return
    given = {a[2:].partition("=")[0] for a in args if a.startswith("--") and "=" in a}
    unknown = given - keys_of(script)
    assert not unknown, f"{document}: `{' '.join(words)}` passes keys {script} does not take: {sorted(unknown)}"
