"""Every command README.md, docs/ and the scripts' own docstrings print, checked as written: the
script or file it runs exists, its --key=value options are keys (and values) that script takes, and
the config and suite files it names exist. (tests/test_configs.py also resolves every documented
train.py command at its world size.)"""
import ast
import functools
import glob
import importlib
import os
import re
import shlex
import subprocess
import sys

import pytest

import configurator
import runtime
from helpers import documented

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = sorted({p for p in glob.glob("*.py", root_dir=REPO) + glob.glob("tools/*.py", root_dir=REPO)
                  if 'if __name__ == "__main__":' in open(os.path.join(REPO, p)).read()})
DOCUMENTS = ["README.md", *sorted(glob.glob("docs/*.md", root_dir=REPO)), *SCRIPTS]
FOREIGN_OPTIONS = ("lm_eval_run.py",)  # hands its options to lm-eval's own command line
RUN_KEYS_TOO = ("train.py", "sweep.py")  # a sweep passes the run's keys on to train.py
OWN_USAGE = {"tests/test_configs.py": [["--write"]]}  # a script's whole usage, not --key=value keys


def document_text(document):
    """A Markdown file's text, or a script's docstring (every line of it may be a command)."""
    with open(os.path.join(REPO, document)) as f:
        text = f.read()
    if document.endswith(".py"):
        return "```\n" + (ast.get_docstring(ast.parse(text)) or "") + "\n```"
    return text


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
        for line in candidate_lines(document_text(document)):
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
def argparse_flags(script):
    """The flags a script on argparse lists in its --help."""
    out = subprocess.run([sys.executable, os.path.join(REPO, script), "--help"], cwd=REPO, capture_output=True,
                         text=True, timeout=120).stdout
    return set(re.findall(r"--(\w+)", out))


def check_options(script, args):
    """A one-line problem with the --key=value options, as the script's own reading finds it, or None."""
    module = importlib.import_module(script[:-3].replace("/", "."))
    options = [a for a in args if a.startswith("--") and a != "--help"]
    if "argparse" in open(os.path.join(REPO, script)).read():
        unknown = {a[2:].partition("=")[0] for a in options} - argparse_flags(script)
        return f"unknown flags {sorted(unknown)}" if unknown else None
    dicts = documented(script[:-3].replace("/", "."), module)
    if os.path.basename(script) in RUN_KEYS_TOO:
        dicts = [d for d in dicts if d is not runtime.DEFAULTS] + [runtime.DEFAULTS]
        unknown = {a[2:].partition("=")[0] for a in options} - {k for d in dicts for k in d}
        return f"unknown keys {sorted(unknown)}" if unknown else None
    text = [key for keys in dicts for key, value in keys.items() if isinstance(value, str)]
    try:
        configurator.options_and_paths(options, *dicts, text_keys=text)
    except configurator.ConfigError as e:
        return str(e)
    return None


COMMANDS = [(document, words) for document, words in documented_commands() if script_of(words)]


def test_the_documents_print_commands():
    scripts = {script_of(words)[0] for _, words in COMMANDS}
    assert {"train.py", "sweep.py", "report.py", "gpu_check.py", "test_all_architectures.py", "tools/noise_budget.py",
            "tools/bench_ra_kernels.py", "tools/bench_comm.py", "tools/bench_ra_variants.py",
            "tools/bench_train_step.py"} <= scripts, scripts


@pytest.mark.parametrize("document,words", COMMANDS, ids=lambda v: v if isinstance(v, str) else " ".join(v)[:80])
def test_a_documented_command_runs_a_file_that_takes_its_options(document, words):
    script, args = script_of(words)
    assert os.path.exists(os.path.join(REPO, script)), f"{document}: {script} does not exist"
    for arg in args:
        path = arg.partition("=")[2] if arg.startswith("--") else arg  # an option's value may name a file too
        if path.endswith(".py") and "/" in path:  # a config or suite file
            assert os.path.exists(os.path.join(REPO, path)), f"{document}: {path} does not exist"
    if script in OWN_USAGE:
        assert args in OWN_USAGE[script], f"{document}: `{' '.join(words)}`: {script} takes {OWN_USAGE[script]}"
        return
    if not script.endswith(".py") or os.path.basename(script) in FOREIGN_OPTIONS:
        return
    problem = check_options(script, args)
    assert problem is None, f"{document}: `{' '.join(words)}`: {problem}"
