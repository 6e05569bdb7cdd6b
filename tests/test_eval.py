"""eval.py: perplexity of a run's checkpoint over fixed windows of val.bin, checked against a direct
forward pass over the same windows."""
import importlib
import json
import math

import numpy as np
import pytest
import torch
from torch.nn import functional as F

import evaluation
import tokendata
from model import GPT, GPTConfig, model_config_fields

eval_script = importlib.import_module("eval")  # the repo's eval.py, not the builtin


@pytest.fixture
def run(tmp_path):
    """A tiny GPT saved as train.py saves ckpt.pt, and a 200-token val.bin."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=16, vocab_size=64, n_layer=2, n_head=2, n_embd=16)).eval()
    config = {k: getattr(model.config, k) for k in model_config_fields()}
    config.update(dataset="fixture", batch_size=2)  # train.py saves its whole config, not only the model's
    torch.save(dict(model=model.state_dict(), config=config), tmp_path / "ckpt.pt")
    tokens = np.random.default_rng(0).integers(0, 64, size=200)
    tokendata.write_split(str(tmp_path / "val.bin"), [tokens])
    return model, tokens, tmp_path


def direct_loss(model, tokens, block_size, windows):
    losses = []
    for k in range(windows):
        x = torch.tensor(tokens[k * block_size:(k + 1) * block_size], dtype=torch.long)
        y = torch.tensor(tokens[k * block_size + 1:(k + 1) * block_size + 1], dtype=torch.long)
        with torch.no_grad():
            logits, _ = model(x[None])
        losses.append(F.cross_entropy(logits[0], y, reduction="none"))
    return torch.cat(losses).double().mean().item()


@pytest.mark.parametrize("eval_tokens, block_size, windows", [
    (100, 0, 6),  # the model's block 16: 100 // 16 = 6 windows, the partial 7th is dropped
    (0, 0, 12),  # the whole split: 199 predictable tokens // 16
    (40, 8, 5),  # a shorter window than the model's
])
def test_perplexity_matches_a_direct_forward(run, eval_tokens, block_size, windows):
    model, tokens, run_dir = run
    out_json = run_dir / "eval.json"
    result = eval_script.main([f"--out_dir={run_dir}", f"--data_dir={run_dir}", f"--eval_tokens={eval_tokens}",
                               f"--block_size={block_size}", "--batch_size=4", "--device=cpu", "--dtype=float32",
                               f"--out_json={out_json}"])
    window = block_size or 16
    expected = direct_loss(model, tokens, window, windows)
    assert result["tokens"] == windows * window and result["windows"] == windows
    assert result["loss"] == pytest.approx(expected, rel=1e-6)
    assert result["ppl"] == pytest.approx(math.exp(expected), rel=1e-6)
    assert json.loads(out_json.read_text()) == result


def test_too_few_tokens_for_one_window(run):
    model, _, run_dir = run
    with pytest.raises(ValueError, match="no full window"):
        evaluation.evaluate_perplexity(model, str(run_dir), 16, 15, "cpu")
