"""export_checkpoint.py --format=hf: a trained run as a Hugging Face GPT2LMHeadModel directory that
transformers loads and that computes our logits; the export read back with --init_from gives our
weights; variants that are not GPT-2 are refused in one line."""
import json
import os
import subprocess
import sys

import pytest
import torch
import transformers

import configurator
import export_checkpoint
import runtime
import tokendata
from helpers import REPO, run_script, tiny_checkpoint, train_gpt2

N = tokendata.GPT2_VOCAB_SIZE


@pytest.fixture(scope="module")
def runs(gpt2_data_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("hf_runs")
    return {name: train_gpt2(gpt2_data_dir, str(root / name), *extra) for name, extra in {
        "bias_tied": (), "nobias_tied": ("--bias=False",), "bias_untied": ("--tie_weights=False",)}.items()}


@pytest.fixture(scope="module")
def exports(runs, tmp_path_factory):
    """Each run's export, written once for the tests that read it (transformers, --init_from, the tokenizer)."""
    root = tmp_path_factory.mktemp("hf_exports")
    return {name: export(run, root / name) for name, run in runs.items()}


def ours(run):
    ckpt = torch.load(os.path.join(run, "ckpt.pt"), map_location="cpu", weights_only=True)
    return runtime.build_model(ckpt["config"], ckpt).eval()


def export(run, out):
    export_checkpoint.main([f"--out_dir={run}", "--format=hf", f"--out={out}"])
    return str(out)


@pytest.mark.parametrize("name", ["bias_tied", "nobias_tied", "bias_untied"])
def test_transformers_loads_the_export_and_computes_our_logits(runs, exports, name):
    model = ours(runs[name])
    hf = transformers.GPT2LMHeadModel.from_pretrained(exports[name], dtype=torch.float32).eval()
    assert hf.config.vocab_size == N and hf.config.n_positions == model.config.block_size
    tied = hf.lm_head.weight.data_ptr() == hf.transformer.wte.weight.data_ptr()
    assert tied == model.config.tie_weights
    idx = torch.randint(0, N, (3, model.config.block_size), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected, _ = model(idx)
        got = hf(idx).logits
    torch.testing.assert_close(got, expected[..., :N], rtol=1e-5, atol=1e-5)
    if not model.config.bias:  # a model without biases exports zero biases, which change nothing
        assert all(torch.all(p == 0) for n, p in hf.named_parameters() if n.endswith(".bias"))


@pytest.mark.parametrize("name", ["bias_tied", "nobias_tied", "bias_untied"])
def test_init_from_reads_the_export_back_to_the_same_weights(runs, exports, name):
    model = ours(runs[name])
    cfg = dict(runtime.DEFAULTS, init_from=exports[name])
    back = runtime.build_model(cfg)  # what train.py --init_from=DIR and sample.py --init_from=DIR build
    mine, theirs = model.state_dict(), back.state_dict()
    assert set(mine) <= set(theirs)
    for key, value in theirs.items():
        if key in mine:
            expected = mine[key][:N] if key in export_checkpoint.VOCAB_ROWS else mine[key]
            assert torch.equal(value, expected), key
        else:  # the biases the model did not have
            assert not model.config.bias and key.endswith(".bias") and torch.all(value == 0), key
    assert back.config.tie_weights == model.config.tie_weights


def test_a_sharded_checkpoint_exports_the_weights_it_holds(gpt2_data_dir, tmp_path):
    """An FSDP run keeps only dcp/: the export reads the newest sharded checkpoint."""
    run = train_gpt2(gpt2_data_dir, str(tmp_path / "fsdp"), "--data_parallel=fsdp")
    assert not os.path.exists(os.path.join(run, "ckpt.pt"))
    model = export_checkpoint.load_sharded(run)[1].eval()
    hf = transformers.GPT2LMHeadModel.from_pretrained(export(run, tmp_path / "hf"), dtype=torch.float32).eval()
    idx = torch.randint(0, N, (2, model.config.block_size), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(hf(idx).logits, model(idx)[0][..., :N], rtol=1e-5, atol=1e-5)


def test_the_export_reexports_to_identical_files(exports, tmp_path):
    """export -> --init_from -> ckpt.pt -> export: the same tensors, bit for bit."""
    from safetensors.torch import load_file
    first = exports["nobias_tied"]
    back = runtime.build_model(dict(runtime.DEFAULTS, init_from=first))
    run2 = tmp_path / "run2"
    run2.mkdir()
    config = dict(runtime.DEFAULTS, **{k: getattr(back.config, k) for k in ("n_layer", "n_head", "n_embd", "block_size",
                                                                             "vocab_size", "bias", "tie_weights")})
    torch.save(dict(model=back.state_dict(), config=config), run2 / "ckpt.pt")
    second = export(run2, tmp_path / "second")
    a, b = (load_file(os.path.join(d, "model.safetensors")) for d in (first, second))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_tokenizer_and_model_card(runs, exports):
    out = exports["bias_tied"]
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    text = "The river runs past the old mill, and the children's boats drift by.<|endoftext|>"
    assert tokenizer(text)["input_ids"] == tokendata.gpt2_encoding().encode(text, allowed_special="all")
    card = open(os.path.join(out, "README.md")).read()
    info = json.load(open(os.path.join(runs["bias_tied"], "run_info.json")))
    for fact in ("n_layer", "learning_rate", "dataset_fingerprint", info["facts"]["dataset_fingerprint"], "repeat"):
        assert fact in card
    assert json.load(open(os.path.join(out, "config.json")))["architectures"] == ["GPT2LMHeadModel"]


@pytest.mark.parametrize("keys, named", [
    (dict(model_type="ra", ra_pattern="late"), "reciprocal attention"),
    (dict(model_type="ra", mla=True, mla_latent_dim=8), "MLA"),
    (dict(model_type="ra", attn_gate=True), "gated attention"),
    (dict(model_type="reduced_sync", block_pattern="tp,spd", tp_size=2), "'spd'"),
    (dict(model_type="reduced_sync", block_pattern="parallel", tp_size=2), "'parallel'"),
    (dict(ln_placement="post"), "ln_placement='post'"),
    (dict(vocab_size=64), "vocab_size=64"),
])
def test_variants_that_are_not_gpt2_are_refused_in_one_line(tmp_path, capsys, keys, named):
    run = tiny_checkpoint(tmp_path / "run", **keys)
    with pytest.raises(configurator.ConfigError, match="lm-eval adapter") as refused:
        export(run, tmp_path / "hf")
    assert named in str(refused.value) and "\n" not in str(refused.value)
    assert not os.path.exists(tmp_path / "hf")
    code, stderr = run_script(capsys, "export_checkpoint.py", f"--out_dir={run}", "--format=hf", f"--out={tmp_path / 'hf'}")
    assert code == 1 and stderr.count("\n") == 1 and "lm-eval adapter" in stderr


def test_a_run_on_other_tokens_is_refused_and_a_damaged_run_info_is_named(tmp_path, capsys):
    """A char-level run of GPT-2's vocabulary size is a GPT-2 shape over other tokens: the exported BPE would lie."""
    run = tiny_checkpoint(tmp_path / "run")
    info = tmp_path / "run" / "run_info.json"
    info.write_text(json.dumps({"facts": {"tokenizer": "char"}}))
    with pytest.raises(configurator.ConfigError, match="trained on 'char' tokens but a GPT2LMHeadModel export uses"):
        export(run, tmp_path / "hf")
    info.write_text('{"facts": {"tok')
    code, stderr = run_script(capsys, "export_checkpoint.py", f"--out_dir={run}", "--format=hf", f"--out={tmp_path / 'hf'}")
    assert code == 1 and stderr.count("\n") == 1, stderr
    assert f"{info} is damaged" in stderr and not os.path.exists(tmp_path / "hf")


def test_reduced_sync_of_tp_blocks_and_plain_ra_are_gpt2(tmp_path):
    """tp blocks split GPT-2 over ranks and ra_pattern='none' without MLA or gates is GPT-2's attention."""
    for keys in (dict(model_type="reduced_sync", block_pattern="tp", tp_size=2), dict(model_type="ra")):
        run = tiny_checkpoint(tmp_path / keys["model_type"], **keys)
        model = ours(run)
        hf = transformers.GPT2LMHeadModel.from_pretrained(export(run, tmp_path / f"{keys['model_type']}_hf")).eval()
        idx = torch.randint(0, N, (2, 16), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            torch.testing.assert_close(hf(idx).logits, model(idx)[0][..., :N], rtol=1e-5, atol=1e-5)


def test_bad_output_directory_and_format(runs, tmp_path):
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "file").write_text("keep me")
    with pytest.raises(configurator.ConfigError, match="not empty"):
        export(runs["bias_tied"], taken)
    assert (taken / "file").read_text() == "keep me"
    with pytest.raises(configurator.ConfigError, match="needs --out"):
        export_checkpoint.main([f"--out_dir={runs['bias_tied']}", "--format=hf"])
    with pytest.raises(configurator.ConfigError, match="format='onnx'"):
        export_checkpoint.main([f"--out_dir={runs['bias_tied']}", "--format=onnx"])
    with pytest.raises(FileNotFoundError, match="train first"):
        export(str(tmp_path / "empty"), tmp_path / "hf")


def test_an_output_path_that_is_a_file_or_cannot_be_written_is_one_line(runs, tmp_path):
    """--out=FILE was a NotADirectoryError traceback; a read-only filesystem an `OSError: [Errno 30]` one."""
    (tmp_path / "a_file").write_text("keep me")
    (tmp_path / "readonly").mkdir()
    command = [sys.executable, "export_checkpoint.py", f"--out_dir={runs['bias_tied']}", "--format=hf"]
    if os.geteuid() == 0:  # root writes through permissions: a read-only mount of its own, as an operator meets it
        readonly = ["unshare", "-m", "bash", "-c", f'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"',
                    str(tmp_path / "readonly")]
        cause = "read-only file system"
    else:
        (tmp_path / "readonly").chmod(0o555)
        readonly, cause = [], "permission denied"
    for prefix, out, message in (
            ([], tmp_path / "a_file", f"error: --out={tmp_path}/a_file is a file: give the directory to write (a new or "
                                      f"empty one)"),
            (readonly, tmp_path / "readonly" / "hf", f"error: {cause} while writing {tmp_path}/readonly/hf; the export "
                                                     f"is incomplete: choose a --out where you can write")):
        done = subprocess.run([*prefix, *command, f"--out={out}"], cwd=REPO, capture_output=True, text=True)
        assert (done.returncode, done.stderr) == (1, message + "\n")
    assert (tmp_path / "a_file").read_text() == "keep me"
