"""The chunked linear + cross-entropy head against the plain one: the same loss and the same
gradient for every parameter (fp32, tight tolerance), tied and untied, with ignored targets and
under gradient accumulation, and compiled; errors for implementations that cannot run here."""
import pytest
import torch
import torch.nn.functional as F

from kernels import linear_cross_entropy as lce
from model import GPT, GPTConfig

TINY = dict(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=97, dropout=0.0)


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of 5 tokens (the last one shorter), so every test crosses chunk boundaries."""
    monkeypatch.setattr(lce, "CHUNK_LOGITS", 5 * TINY["vocab_size"])


def grads_close(a, b, rtol=1e-5, atol=1e-7):
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=rtol, atol=atol, msg=lambda m: f"{name}: {m}")


def test_function_matches_plain_cross_entropy(small_chunks):
    torch.manual_seed(0)
    x = torch.randn(23, 16, dtype=torch.float64, requires_grad=True)
    w = torch.randn(97, 16, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 97, (23,))
    targets[[0, 6, 7, 22]] = -1
    loss = lce.linear_cross_entropy(x, w, targets, "chunked")
    (3.0 * loss).backward()  # a non-unit incoming gradient must scale both gradients
    gx, gw = x.grad, w.grad
    x.grad = w.grad = None
    ref = F.cross_entropy(F.linear(x, w), targets, ignore_index=-1)
    (3.0 * ref).backward()
    torch.testing.assert_close(loss, ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(gx, x.grad, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(gw, w.grad, rtol=1e-12, atol=1e-12)


def test_loss_stays_finite_where_the_target_probability_underflows():
    """The chunk takes log-sum-exp from its largest probability (>= 1/V), not from the target's,
    which is exp(-250) = 0 in fp32 here: the loss is 250, not inf, and the gradients are exact."""
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0]], requires_grad=True)
    w = torch.tensor([[100.0, 0.0], [-150.0, 3.0], [0.0, 2.0]], requires_grad=True)
    targets = torch.tensor([1, 2])
    loss = lce.linear_cross_entropy(x, w, targets, "chunked")
    loss.backward()
    gx, gw = x.grad, w.grad
    x.grad = w.grad = None
    ref = F.cross_entropy(F.linear(x, w), targets)
    ref.backward()
    assert torch.isfinite(loss) and loss.item() > 100
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(gx, x.grad)
    torch.testing.assert_close(gw, w.grad)


def pair(**overrides):
    """The same weights with the chunked and with the full head."""
    torch.manual_seed(0)
    full = GPT(GPTConfig(**{**TINY, **overrides}, head_loss="full"))
    chunked = GPT(GPTConfig(**{**TINY, **overrides}, head_loss="chunked"))
    chunked.load_state_dict(full.state_dict())
    return full, chunked


@pytest.mark.parametrize("tie_weights", [True, False])
def test_model_loss_and_every_gradient_match_full_head(small_chunks, tie_weights):
    full, chunked = pair(tie_weights=tie_weights)
    idx = torch.randint(0, 97, (3, 16), generator=torch.Generator().manual_seed(1))
    targets = torch.roll(idx, -1, dims=1)
    targets[:, -1] = -1  # ignore_index: the last position has no next token
    targets[1, :4] = -1
    logits, loss_full = full(idx, targets)
    none, loss_chunked = chunked(idx, targets)
    assert logits.shape == (3, 16, 97) and none is None  # the chunked head never builds the logits
    loss_full.backward()
    loss_chunked.backward()
    torch.testing.assert_close(loss_chunked, loss_full, rtol=1e-6, atol=1e-6)
    grads_close(chunked, full)
    assert chunked.lm_head.weight.grad is not None


def test_gradient_accumulation_matches_full_head(small_chunks):
    full, chunked = pair()
    gen = torch.Generator().manual_seed(2)
    for _ in range(3):  # three micro-steps, each loss / 3, gradients summed in .grad
        idx = torch.randint(0, 97, (2, 16), generator=gen)
        targets = torch.randint(-1, 97, (2, 16), generator=gen)  # -1 now and then
        for model in (full, chunked):
            (model(idx, targets)[1] / 3).backward()
    grads_close(chunked, full)


def test_evaluation_keeps_full_logits():
    _, chunked = pair()
    idx = torch.randint(0, 97, (2, 16))
    with torch.no_grad():
        logits, loss = chunked(idx, idx)
    assert logits.shape == (2, 16, 97)
    torch.testing.assert_close(loss, F.cross_entropy(logits.flatten(0, 1), idx.flatten()))


def test_bfloat16_autocast_stays_close(small_chunks):
    """Under autocast both heads run bf16 matmuls and an fp32 softmax: equal up to bf16 rounding."""
    full, chunked = pair()
    idx = torch.randint(0, 97, (2, 16), generator=torch.Generator().manual_seed(3))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss_full, loss_chunked = full(idx, idx)[1], chunked(idx, idx)[1]
    loss_full.backward()
    loss_chunked.backward()
    torch.testing.assert_close(loss_chunked, loss_full, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(chunked.lm_head.weight.grad, full.lm_head.weight.grad, rtol=0.05, atol=2e-3)


def test_unknown_and_unavailable_implementations_fail_at_config():
    with pytest.raises(ValueError, match="head_loss='fused'"):
        GPTConfig(**TINY, head_loss="fused")
    with pytest.raises(ValueError, match="CUDA only"):
        lce.check_head_loss_trains("liger", "cpu", "bfloat16")
    with pytest.raises(ValueError, match="bfloat16 or float16 only"):
        lce.check_head_loss_trains("cce", "cuda", "float32")


@pytest.mark.parametrize("device,dtype", [("cuda:0", "bfloat16"), ("cuda:0", "float32")])
def test_auto_head_follows_the_memory_estimate(device, dtype):
    """head_loss='auto' takes the full head on a GPU whose free memory holds the estimate of the run with
    the full head's logits (times the margin), the chunked head when it does not, and says why in one
    line; a CPU always gets the chunked head; a head that is set is kept. GPT-2 124M at 16 x 1024, the
    estimate as train.py asks for it, against a fake device memory size."""
    import runtime
    import sharding
    import messages
    from sharding import FULL_HEAD_MARGIN, choose_head_loss
    from parallel import ParallelLayout
    cfg = runtime.settle(dict(runtime.DEFAULTS, batch_size=16, gradient_accumulation_steps=1))
    assert cfg["head_loss"] == "auto"
    n_params = runtime.count_params(cfg)
    layout = ParallelLayout()
    layout.device = device
    estimate = lambda head: sharding.memory_estimate(dict(cfg, head_loss=head), n_params, 1, dtype, "cuda")["total"]
    full, chunked = FULL_HEAD_MARGIN * estimate("full"), estimate("chunked")
    assert chunked < full < 141 * 2**30  # the chunked head holds one chunk of logits, not all of them

    choice = choose_head_loss(cfg, layout, n_params, dtype, available=141 * 2**30)  # an H200
    assert (choice.head_loss, choice.reason, choice.needed) == ("full", "fits", full)
    assert messages.head_choice(choice).startswith("full (auto: the estimate with the full head's logits x 1.25")
    assert choose_head_loss(cfg, layout, n_params, dtype, available=int(full) + 1).head_loss == "full"
    choice = choose_head_loss(cfg, layout, n_params, dtype, available=int(full) - 2**20)
    why = messages.head_choice(choice)
    assert choice.head_loss == "chunked" and f"{full / 2**30:,.1f} GiB, exceeds the" in why and "\n" not in why
    choice = choose_head_loss(dict(cfg, head_loss="full"), layout, n_params, dtype, available=chunked)
    assert (choice.head_loss, messages.head_choice(choice)) == ("full", "full (as set)")
    layout.device = "cpu"
    assert choose_head_loss(cfg, layout, n_params, dtype, available=10**15).head_loss == "chunked"


def test_compiles_into_one_graph_with_the_same_loss_and_gradients(monkeypatch):
    """torch.compile traces the chunk loop (fullgraph: no fallback to eager at the head)."""
    monkeypatch.setattr(lce, "CHUNK_LOGITS", 12 * TINY["vocab_size"])  # 32 tokens: chunks of 11, 11 and 10
    _, chunked = pair(n_layer=1)
    idx = torch.randint(0, 97, (2, 16), generator=torch.Generator().manual_seed(4))
    targets = idx.clone()
    targets[0, :3] = -1
    _, eager_loss = chunked(idx, targets)
    eager_loss.backward()
    eager_grads = {name: p.grad.clone() for name, p in chunked.named_parameters()}
    chunked.zero_grad(set_to_none=True)
    _, loss = torch.compile(chunked, fullgraph=True)(idx, targets)
    loss.backward()
    torch.testing.assert_close(loss, eager_loss, rtol=1e-6, atol=1e-6)
    for name, p in chunked.named_parameters():
        torch.testing.assert_close(p.grad, eager_grads[name], rtol=1e-5, atol=1e-6, msg=name)


def spy_on(monkeypatch, module, name, calls):
    """Stand in for a CUDA package's function on CPU: the call must bind to the installed package's real
    signature; the loss is the plain head's, computed from the operands as passed."""
    import importlib
    import inspect
    module = importlib.import_module(module)
    signature = inspect.signature(getattr(module, name))

    def stand_in(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        calls.append(bound.arguments)
        x, weight, targets = list(bound.arguments.values())[:3]
        return F.cross_entropy(F.linear(x, weight).float(), targets, ignore_index=bound.arguments["ignore_index"])
    monkeypatch.setattr(module, name, stand_in)


@pytest.mark.parametrize("head_loss,module,name", [("cce", "cut_cross_entropy", "linear_cross_entropy"),
                                                   ("liger", "liger_kernel.transformers.functional",
                                                    "liger_fused_linear_cross_entropy")])
def test_package_call_sites_pass_what_the_real_packages_require(monkeypatch, head_loss, module, name):
    """CCE: bf16/fp16 operands (its backward asserts them; ln_f's output is fp32 under autocast) and
    filter_eps=None (its default drops small gradient terms). Liger: float32 accumulation of the weight's
    gradient. The gradients then match the full head's up to bf16 rounding."""
    calls = []
    spy_on(monkeypatch, module, name, calls)
    torch.manual_seed(0)
    full = GPT(GPTConfig(**TINY, head_loss="full"))
    package = GPT(GPTConfig(**TINY, head_loss=head_loss))
    package.load_state_dict(full.state_dict())
    idx = torch.randint(0, 97, (2, 16), generator=torch.Generator().manual_seed(5))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        losses = [m(idx, idx)[1] for m in (full, package)]
    for loss in losses:
        loss.backward()
    (arguments,) = calls
    if head_loss == "cce":
        assert arguments["e"].dtype == arguments["c"].dtype == torch.bfloat16 and arguments["filter_eps"] is None
    else:
        assert arguments["accum_dtype"] == torch.float32
    assert arguments["ignore_index"] == -1
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-2, atol=1e-2)
    assert package.lm_head.weight.grad.dtype == torch.float32
    torch.testing.assert_close(package.lm_head.weight.grad, full.lm_head.weight.grad, rtol=0.05, atol=2e-3)


def test_the_chunked_head_runs_under_deterministic_algorithms():
    """deterministic=True refuses ops without a deterministic kernel on a GPU (scatter_add_ on CUDA was
    the chunked head's one-hot): under the switch the head's loss and gradients are unchanged."""
    torch.manual_seed(0)
    x, weight = torch.randn(12, 16, requires_grad=True), torch.randn(40, 16, requires_grad=True)
    target = torch.randint(0, 40, (12,))
    runs = []
    for on in (False, True):
        torch.use_deterministic_algorithms(on)
        try:
            loss = lce.linear_cross_entropy(x, weight, target)
            runs.append([loss.detach(), *torch.autograd.grad(loss, (x, weight))])
        finally:
            torch.use_deterministic_algorithms(False)
    assert all(torch.equal(a, b) for a, b in zip(*runs))
