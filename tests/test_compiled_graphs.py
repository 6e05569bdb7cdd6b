"""A compiled block is one graph with no break, for every attention path (issue 59): torch._dynamo.explain
on one block of a tiny 2-layer model, as parallel.compile_model compiles each block's forward. The kernel
module is imported and the SDPA value-size probe marked constant when a layer is built (ra_model), not in
the traced call, where each was a graph break at every step (sdpa mix: 7 graphs; triton: 6).

The counting runs in a subprocess with TRITON_INTERPRET=1, so the triton paths run the fused kernel under the
interpreter whatever imported Triton before in this process (tests do not depend on how they are started).
It counts what gpu_check.py's compile rows count (gpu_check.block_graphs), on a GPU the real kernels."""

import json
import os
import subprocess
import sys

import pytest
import torch

import gpu_check

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AUTO_TRITON = "RA mix, auto (the fused kernel chosen)"
COUNT = f"""
import json
import gpu_check, ra_model
found = {{name: gpu_check.block_graphs(keys, "cpu", "float32", gpu_check.DRY_COMPILE_MODEL)
         for name, keys in gpu_check.COMPILE_PATHS.items()}}
# attn_impl='auto' where its measurement chose the fused kernel (a CPU never does: it times GPUs only)
ra_model.measure_choice = lambda *args: dict(impl="triton", sdpa_ms=2.0, fused_ms=1.0, reason="set by the test")
ra_model.AUTO_CHOICES.clear()  # the row above recorded SDPA for this shape
found[{AUTO_TRITON!r}] = gpu_check.block_graphs(dict(ra_mode="mix", attn_impl="auto"), "cpu", "float32",
                                              gpu_check.DRY_COMPILE_MODEL)
print(json.dumps(dict(interpreted=ra_model.fused_kernels().INTERPRET, found=found)))
"""


@pytest.fixture(scope="module")
def counted():
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", COUNT], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["interpreted"]
    return result["found"]


@pytest.mark.parametrize("path", [*gpu_check.COMPILE_PATHS, AUTO_TRITON])
def test_a_compiled_block_is_one_graph_without_a_break(counted, path):
    found = counted[path]
    assert (found["graphs"], found["breaks"]) == (1, 0), found["why"]
    keys = dict(gpu_check.COMPILE_PATHS.get(path, dict(attn_impl="triton")))
    # the triton paths run the kernel's op inside the graph; auto on a CPU measures nothing and keeps SDPA
    assert found["kernel"] == (keys.get("attn_impl") == "triton"), path


def test_a_graph_break_fails_the_compile_row(monkeypatch):
    """Without the build-time marking, the probe traced inside the block breaks its graph: the row says
    how many and FAILs (the check that gpu_check.py runs on the GPU, fed here a break of the old kind)."""
    import devices
    import ra_model

    def unmarked(device, dtype):  # the probe as it was: called in the traced forward, answer not constant
        return devices.fused_sdpa_takes_unequal_value_size(device, dtype)

    monkeypatch.setattr(ra_model, "sdpa_takes_unequal_value_size", unmarked)
    monkeypatch.setattr(ra_model, "probe_as_constant", lambda: None)
    monkeypatch.setattr(gpu_check, "COMPILE_PATHS", {"RA mix, sdpa": dict(ra_mode="mix")})
    (row,) = gpu_check.compile_rows("cpu", "float32", gpu_check.DRY_COMPILE_MODEL)
    assert row["status"] == "FAIL" and not row["measured"].startswith("1 graph, 0 breaks"), row
    monkeypatch.undo()
    monkeypatch.setattr(gpu_check, "COMPILE_PATHS", {"RA mix, sdpa": dict(ra_mode="mix")})
    (row,) = gpu_check.compile_rows("cpu", "float32", gpu_check.DRY_COMPILE_MODEL)
    assert row["status"] == "pass" and row["measured"] == "1 graph, 0 breaks", row


def test_the_compiled_block_computes_what_the_eager_one_does():
    """The probe's answer, baked into the graph as a constant, is the eager one: same output and gradients."""
    import ra_model
    torch.manual_seed(0)
    cfg = ra_model.RAConfig(**gpu_check.DRY_COMPILE_MODEL, ra_pattern="all", ra_mode="mix", ra_window=8)
    block = ra_model.RAGPT(cfg).transformer.h[1]
    x = torch.randn(2, cfg.block_size, cfg.n_embd, generator=torch.Generator().manual_seed(1), requires_grad=True)
    eager = block(x)
    (dx,) = torch.autograd.grad(eager.sum(), x)
    torch._dynamo.reset()
    compiled = torch.compile(block, backend="aot_eager", fullgraph=True)(x)
    (dx_c,) = torch.autograd.grad(compiled.sum(), x)
    torch.testing.assert_close(compiled, eager, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(dx_c, dx, rtol=1e-6, atol=1e-6)


# ----------------------------------------------------------------------------- the head (issue 59)
# parallel.compile_model compiles the head (ln_f, lm_head, the loss) as one more region: fullgraph, fixed shape.

def tiny_head_model(head_loss):
    from model import GPT, GPTConfig
    torch.manual_seed(0)
    return GPT(GPTConfig(**dict(gpu_check.DRY_COMPILE_MODEL, head_loss=head_loss, dropout=0.0)))


def head_inputs(model):
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(2, model.config.block_size, model.config.n_embd, generator=generator, requires_grad=True)
    y = torch.randint(model.config.vocab_size, (2, model.config.block_size), generator=generator)
    y[0, :3] = -1  # ignored targets, as a padded batch has
    return x, y


@pytest.mark.parametrize("head_loss", ["full", "chunked"])
def test_the_compiled_head_is_one_graph_without_a_break(head_loss):
    model = tiny_head_model(head_loss)
    torch._dynamo.reset()
    found = torch._dynamo.explain(model.head)(*head_inputs(model))
    assert (found.graph_count, found.graph_break_count) == (1, 0), found.break_reasons


def test_compile_model_compiles_the_settled_head_and_leaves_kernel_heads_eager():
    from parallel import compile_model
    compiled = lambda model: hasattr(model.head, "_torchdynamo_orig_callable")
    assert compiled(compile_model(tiny_head_model("full"))) and compiled(compile_model(tiny_head_model("chunked")))
    assert not compiled(compile_model(tiny_head_model("liger")))  # reads a count with .item(): a break


@pytest.mark.parametrize("head_loss", ["full", "chunked"])
def test_the_compiled_head_computes_the_eager_loss_and_gradients(head_loss):
    """Inductor (what train.py's compile runs), fullgraph at a fixed shape: the eager head's loss and the
    gradients of its input and weight, to float32 rounding (fusion reorders the sums)."""
    model = tiny_head_model(head_loss)
    x, y = head_inputs(model)
    loss = model.head(x, y)[1]
    grads = torch.autograd.grad(loss, (x, model.lm_head.weight, model.transformer.ln_f.weight))
    torch._dynamo.reset()
    head = torch.compile(model.head, fullgraph=True, dynamic=False)
    compiled_loss = head(x, y)[1]
    compiled_grads = torch.autograd.grad(compiled_loss, (x, model.lm_head.weight, model.transformer.ln_f.weight))
    torch.testing.assert_close(compiled_loss, loss, rtol=1e-5, atol=1e-6)
    for compiled_grad, grad in zip(compiled_grads, grads):
        torch.testing.assert_close(compiled_grad, grad, rtol=1e-5, atol=1e-6)


def test_compile_defaults_to_on_where_a_cuda_device_trains():
    """compile=None (the default) is settled once, by the device: on for CUDA, off for CPUs and MPS; a set value stays."""
    import runtime
    settled = lambda **keys: runtime.settle(dict(runtime.DEFAULTS, out_dir="unused", **keys))["compile"]
    assert runtime.DEFAULTS["compile"] is None
    assert settled(device="cuda") is True and settled(device="cuda:1") is True
    assert settled(device="cpu") is False and settled(device="mps") is False
    assert settled(device="") is torch.cuda.is_available()
    assert settled(device="cuda", compile=False) is False and settled(device="cpu", compile=True) is True
