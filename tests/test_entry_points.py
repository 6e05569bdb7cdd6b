"""Every documented entry point run the way a user runs it: `--help`, and the evaluators on one
process and under torchrun on 2 gloo ranks (the documented commands that once crashed)."""
import importlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import configurator
import tokendata
from model import GPT, GPTConfig, model_config_fields
from test_hellaswag import FIXTURE, write_jsonl

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Scripts whose keys are read by configurator.py (DEFAULTS, or a tool's OPTIONS and the keys it shares),
# each with a meaning its --help must show; the data preparation scripts use argparse.
CONFIG_SCRIPTS = {
    "train": "micro-steps per optimizer step, summed over all processes",
    "sample": "'bfloat16', 'float16', 'float32'",
    "eval": "'bfloat16', 'float16', 'float32'",
    "hellaswag": "'bfloat16', 'float16', 'float32'",
    "sweep": "print the runs (and check them) without starting any",
    "report": "a variant name or a directory",
    "export_checkpoint": "a Hugging Face GPT2LMHeadModel directory",
    "gpu_check": "where the rows are written",
    "test_all_architectures": "run the reduced-sync entries sharded on this many gloo ranks",
    "tools.bench_ra_variants": "window of the *_window and ra_mla variants",
    "tools.bench_train_step": "peak memory of one step on fake tensors, no timing",
    "tools.bench_comm": "InfiniBand: TP across this many nodes, one rank each",
    "tools.bench_ra_kernels": "sequence lengths, comma-separated",
    "tools.bench_suite_designs": "the seeds each design runs",
    "tools.noise_budget": "runs at a time the seed-hour assumes",
    "tools.calibration": "the seeds of each sub-suite (a pilot)",
}
ARGPARSE_SCRIPTS = ("data.shakespeare.prepare", "data.openwebtext.prepare", "data.finewebedu.prepare",
                    "data.wikitext2.prepare")
SHARED_KEYS = ("tools.bench_ra_variants", "tools.bench_train_step")  # and benchrows.SHARED's


def documented(name, module):
    """The dicts of keys a script's --help lists."""
    if name in SHARED_KEYS:
        return [module.OPTIONS, importlib.import_module("tools.benchrows").SHARED]
    if hasattr(module, "OPTIONS"):
        return [module.OPTIONS]
    return [getattr(module, "DEFAULTS", None) or importlib.import_module("runtime").DEFAULTS]  # train: runtime's


@pytest.mark.parametrize("name", CONFIG_SCRIPTS)
def test_config_scripts_answer_help_with_keys_defaults_and_meanings(name, monkeypatch, capsys):
    module = importlib.import_module(name)
    monkeypatch.setattr(sys, "argv", [f"{name}.py", "--help"])
    with pytest.raises(SystemExit) as done:
        configurator.run_script(module.main)
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(module.__doc__.strip().split("\n")[0])
    for defaults in documented(name, module):
        for key, value in defaults.items():
            assert f"--{key}={value!r}" in out, key
    assert CONFIG_SCRIPTS[name] in out
    if name == "train":
        assert "\n  # reciprocal attention and MLA" in out  # comment lines become headings
    if name in SHARED_KEYS:  # the shared keys' meanings and headings, after the tool's own
        assert out.index("--preset=") < out.index("\n  # the model's shape: each key left at 0 takes the preset's value")
        assert "untimed steps first (compile happens here)" in out


def test_every_tool_reads_its_keys_with_the_configurator():
    tools = sorted(f"tools.{f[:-3]}" for f in os.listdir(os.path.join(REPO, "tools"))
                   if f.endswith(".py") and 'if __name__ == "__main__":' in open(os.path.join(REPO, "tools", f)).read())
    assert tools and set(tools) <= set(CONFIG_SCRIPTS)
    for name in [*tools, "gpu_check", "test_all_architectures"]:
        assert "argparse" not in open(os.path.join(REPO, *name.split(".")) + ".py").read(), name


@pytest.mark.parametrize("name, args, message", [
    ("tools.bench_train_step", ["--options=plain,fast"], "error: unknown options ['fast']: use a comma list of plain,"),
    ("tools.bench_train_step", ["--memory_only=True", "--options=all_compiled"], "error: --memory_only=True runs eager on fake tensors"),
    ("tools.bench_ra_variants", ["--preset=huge"], "error: --preset='huge': use one of small, gpt2"),
    ("tools.bench_ra_variants", ["--n_head=3"], "error: --n_head=3 must divide --n_embd=128"),
    ("tools.bench_ra_variants", ["--steps=0"], "error: --steps=0: use a whole number >= 1"),
    ("tools.bench_ra_kernels", ["--T", "1024", "4096"], "error: override '--T' needs a value: write --T=VALUE"),
    ("tools.bench_ra_kernels", ["--T=1024,4k"], "error: --T=1024,4k: comma-separated whole numbers"),
    ("tools.bench_comm", [], "error: run under torchrun: torchrun --standalone --nproc_per_node=2"),
    ("tools.bench_comm", ["--nvlink_beta_gbps=0"], "error: --nvlink_beta_gbps=0.0: use a number > 0"),
    ("test_all_architectures", ["--only", "post"], "error: override '--only' needs a value: write --only=VALUE"),
    ("test_all_architectures", ["--ranks=two"], "error: config key 'ranks' (from --ranks=two) expects int"),
    ("gpu_check", ["out.json"], "error: 'out.json': gpu_check.py takes only --json=PATH"),
])
def test_tools_refuse_bad_input_in_one_line_before_any_work(name, args, message, monkeypatch, capsys):
    module = importlib.import_module(name)
    for variable in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr(sys, "argv", [name, *args])
    with pytest.raises(SystemExit) as done:
        configurator.run_script(module.main)
    out, err = capsys.readouterr()
    assert done.value.code == 1 and out == "", out
    assert err.startswith(message) and err.count("\n") == 1, err


@pytest.mark.parametrize("name", ARGPARSE_SCRIPTS)
def test_argparse_scripts_answer_help(name, monkeypatch, capsys):
    module = importlib.import_module(name)
    monkeypatch.setattr(sys, "argv", [name, "--help"])
    with pytest.raises(SystemExit) as done:
        module.main(["--help"])
    assert done.value.code == 0
    assert "usage:" in capsys.readouterr().out


def test_train_help_as_a_command():
    proc = subprocess.run([sys.executable, "train.py", "--help"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "--tokens_per_iter=0" in proc.stdout and proc.stderr == ""


# ----------------------------------------------------------------------------- evaluators on 2 ranks

@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A tiny GPT-2-vocabulary checkpoint as train.py writes it, a val.bin and a HellaSwag file."""
    d = tmp_path_factory.mktemp("run")
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=32, vocab_size=50304, n_layer=2, n_head=2, n_embd=16))
    with torch.no_grad():
        model.transformer.wte.weight.mul_(25)  # spread the logits: no near ties between endings
    config = {k: getattr(model.config, k) for k in model_config_fields()}
    config.update(model_type="gpt", dataset="fixture")
    torch.save(dict(model=model.state_dict(), config=config), d / "ckpt.pt")
    tokendata.write_split(str(d / "val.bin"), [np.random.default_rng(0).integers(0, 50257, size=300)])
    write_jsonl(d / "hellaswag_val.jsonl", FIXTURE)
    return d


def torchrun(script, args, tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           script, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc


def test_hellaswag_under_torchrun_equals_one_process(run_dir, tmp_path):
    import hellaswag
    args = [f"--out_dir={run_dir}", f"--input={run_dir}/hellaswag_val.jsonl", "--device=cpu", "--dtype=float32",
            "--batch_size=1"]
    alone = hellaswag.main([*args, f"--out_items={tmp_path}/alone.jsonl"])
    proc = torchrun(os.path.join(REPO, "hellaswag.py"), [*args, f"--out_json={tmp_path}/h.json",
                                                         f"--out_items={tmp_path}/ranks.jsonl"], tmp_path)
    result = json.loads((tmp_path / "h.json").read_text())
    assert {k: result[k] for k in alone} == alone and alone["n"] == len(FIXTURE)
    # every example's scores, gathered from the rank that scored it, as one process wrote them
    assert (tmp_path / "ranks.jsonl").read_text() == (tmp_path / "alone.jsonl").read_text()
    assert proc.stdout.count("HellaSwag acc") == 1  # the master reports, once


def test_eval_under_torchrun_equals_one_process(run_dir, tmp_path):
    eval_script = importlib.import_module("eval")
    args = [f"--out_dir={run_dir}", f"--data_dir={run_dir}", "--device=cpu", "--dtype=float32", "--batch_size=2"]
    alone = eval_script.main(args)
    proc = torchrun(os.path.join(REPO, "eval.py"), [*args, f"--out_json={tmp_path}/e.json"], tmp_path)
    result = json.loads((tmp_path / "e.json").read_text())
    assert result["windows"] == alone["windows"] == 9 and result["tokens"] == alone["tokens"]
    assert result["loss"] == pytest.approx(alone["loss"], rel=1e-6, abs=0)  # per-row rounding only
    assert proc.stdout.count("perplexity") == 1


def test_config_error_under_torchrun_is_printed_once(tmp_path):
    """Every rank checks the same config: the refusal is one line, not one per rank."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           os.path.join(REPO, "train.py"), os.path.join(REPO, "config", "train_shakespeare.py"),
                           "--gradient_accumulation_steps=3", "--device=cpu"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert proc.stderr.count("error: gradient_accumulation_steps=3 is the total over all processes") == 1, proc.stderr


@pytest.mark.parametrize("head_loss,package", [("liger", "liger_kernel"), ("cce", "cut_cross_entropy")])
def test_checkpoint_of_a_package_head_is_evaluated_without_the_package(run_dir, tmp_path, monkeypatch, capsys,
                                                                       head_loss, package):
    """Evaluation, sampling, HellaSwag and export never call the training head: a run trained with
    liger or cce is read where that package is missing."""
    import export_checkpoint
    import hellaswag
    import sample
    eval_script = importlib.import_module("eval")
    ckpt = torch.load(os.path.join(run_dir, "ckpt.pt"), weights_only=True)
    ckpt["config"]["head_loss"] = head_loss
    run = tmp_path / "run"
    run.mkdir()
    torch.save(ckpt, run / "ckpt.pt")
    monkeypatch.setitem(sys.modules, package, None)  # `import liger_kernel` raises ImportError
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == package else find_spec(name, *a))
    common = [f"--out_dir={run}", "--device=cpu", "--dtype=float32"]
    assert eval_script.main([*common, f"--data_dir={run_dir}", "--batch_size=2"])["windows"] == 9
    sample.main([*common, "--num_samples=1", "--max_new_tokens=4", "--start=Hello"])
    assert hellaswag.main([*common, f"--input={run_dir}/hellaswag_val.jsonl", "--batch_size=1"])["n"] == len(FIXTURE)
    export_checkpoint.main([f"--out_dir={run}", "--format=hf", f"--out={tmp_path / 'hf'}"])
    assert (tmp_path / "hf" / "config.json").exists()


def test_gpu_check_without_a_gpu_says_so_in_one_line(tmp_path):
    """The self-check needs a GPU (it is no part of this suite); here it answers in one line."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", HIP_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, os.path.join(REPO, "gpu_check.py"), f"--json={tmp_path}/g.json"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and proc.stdout == "" and not (tmp_path / "g.json").exists()
    assert proc.stderr.count("\n") == 1 and "no GPU is visible" in proc.stderr, proc.stderr
