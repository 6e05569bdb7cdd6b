"""parallel.py's own logic on one process: the degrees a plan checks, the mesh it would build, which
gradient synchronization a micro-step gets, and the collectives that are no-ops without peers."""
import os
from contextlib import nullcontext

import pytest
import torch

import configurator
import parallel
import runtime
from helpers import run_ranks
from parallel import ParallelLayout, pick_device
from rundir import checkpoint_path


def plan(world_size, **keys):
    return ParallelLayout.plan(dict(runtime.DEFAULTS, **keys), world_size)


@pytest.mark.parametrize("world, keys, dims", [
    (8, {}, {}),  # plain DDP over all ranks: no mesh
    (8, dict(model_type="reduced_sync", tp_size=2), {"dp": 4, "tp": 2}),
    (8, dict(data_parallel="fsdp"), {"shard": 8}),
    (8, dict(data_parallel="hsdp", hsdp_shard_size=4), {"replicate": 2, "shard": 4}),
    (8, dict(data_parallel="hsdp", hsdp_shard_size=2, model_type="reduced_sync", tp_size=2),
     {"replicate": 2, "shard": 2, "tp": 2}),
])
def test_a_plan_splits_the_world_into_replicas_shards_and_tensor_parallel_ranks(world, keys, dims):
    layout = plan(world, **keys)
    assert layout.mesh_dims() == dims
    assert layout.tp * layout.dp == layout.world_size == world
    assert layout.replicate * layout.shard == layout.dp
    if dims:  # the mesh covers every rank, tp innermost
        assert list(dims)[-1] == ("tp" if layout.tp > 1 else list(dims)[-1])
        assert torch.tensor(list(dims.values())).prod().item() == world


def test_one_process_plans_one_replica_whatever_the_keys():
    layout = plan(1, data_parallel="fsdp")
    assert (layout.world_size, layout.tp, layout.dp, layout.shard, layout.replicate) == (1, 1, 1, 1, 1)
    assert not layout.sharded and layout.describe() == "none (one process)"


@pytest.mark.parametrize("world, keys, message", [
    (2, dict(tp_size=2), "tp_size=2 needs model_type='reduced_sync'"),
    (6, dict(model_type="reduced_sync", tp_size=4), "tp_size=4 does not divide the world size 6"),
    (8, dict(data_parallel="hsdp", hsdp_shard_size=3), "hsdp_shard_size=3 does not divide the 8 data-parallel ranks"),
    (4, dict(data_parallel="zero3"), "data_parallel='zero3'"),
])
def test_a_plan_refuses_degrees_that_do_not_fit_in_one_line(world, keys, message):
    with pytest.raises(configurator.ConfigError, match=message.replace("(", r"\(")):
        plan(world, **keys)


def test_hsdp_shards_one_node_by_default(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    layout = plan(16, data_parallel="hsdp")
    assert (layout.replicate, layout.shard) == (4, 4)


@pytest.mark.parametrize("rank, dp_rank, tp_rank", [(0, 0, 0), (1, 0, 1), (2, 1, 0), (7, 3, 1)])
def test_tensor_parallel_ranks_of_a_replica_are_consecutive(rank, dp_rank, tp_rank):
    layout = plan(8, model_type="reduced_sync", tp_size=2)
    layout.rank = rank
    assert (layout.dp_rank, layout.tp_rank, layout.master) == (dp_rank, tp_rank, rank == 0)


class FakeModel:
    def __init__(self):
        self.calls = []

    def no_sync(self):
        self.calls.append("no_sync")
        return nullcontext("no_sync")

    def set_requires_gradient_sync(self, sync):
        self.calls.append(("set_requires_gradient_sync", sync))


@pytest.mark.parametrize("data_parallel, distributed, expected", [
    ("ddp", False, [[], []]),  # one process: nothing to reduce
    ("ddp", True, [["no_sync"], []]),  # DDP all-reduces after the last micro-step only
    ("fsdp", True, [[("set_requires_gradient_sync", False)], [("set_requires_gradient_sync", True)]]),
])
def test_only_the_last_micro_step_synchronizes_gradients(data_parallel, distributed, expected):
    layout = plan(1, data_parallel=data_parallel)
    layout.distributed = distributed
    seen = []
    for last in (False, True):
        model = FakeModel()
        with layout.gradient_sync(model, last=last):
            pass
        seen.append(model.calls)
    assert seen == expected
    assert layout.sharded == (distributed and data_parallel != "ddp")


def test_collectives_are_no_ops_on_one_process():
    layout = ParallelLayout().start("cpu")
    assert not layout.distributed and layout.device == "cpu" and layout.mesh is None
    t = torch.tensor([1.0, 3.0])
    assert layout.all_reduce(t, mean=True) is t and t.tolist() == [1.0, 3.0]
    obj = {"a": [1, 2]}
    assert layout.broadcast_object(obj) is obj
    assert layout.all_gather_object(obj) == [obj]
    layout.barrier()
    scaler = torch.amp.GradScaler("cpu", enabled=True)
    layout.agree_on_skipping(scaler, None)  # nothing to agree on: it never reads the scaler's state


def test_clipping_on_one_process_is_torchs_whole_model_norm():
    torch.manual_seed(0)
    models = [torch.nn.Linear(4, 3) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    for m in models:
        m(torch.randn(5, 4, generator=torch.Generator().manual_seed(1))).pow(2).sum().backward()
    norm = ParallelLayout().clip_grad_norm(models[0], 0.5)
    assert torch.equal(norm, torch.nn.utils.clip_grad_norm_(models[1].parameters(), 0.5))
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(models[0].parameters(), models[1].parameters()))


def test_pick_device_refuses_what_it_cannot_run_on(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert pick_device("") == "cpu" and pick_device("cpu") == "cpu"
    with pytest.raises(configurator.ConfigError, match="use cpu, cuda, cuda:N or mps"):
        pick_device("gpu0")
    with pytest.raises(configurator.ConfigError, match="no CUDA GPU is visible"):
        pick_device("cuda:1")


def test_checkpoint_path_prefers_the_single_file(tmp_path):
    out = str(tmp_path)
    assert checkpoint_path(out) is None
    latest = tmp_path / "dcp" / "latest"
    latest.parent.mkdir()
    (tmp_path / "dcp" / "step_4").mkdir()
    latest.write_text("step_4")
    sharded = checkpoint_path(out)
    assert sharded is not None and checkpoint_path(out, sharded=False) is None
    (tmp_path / "ckpt.pt").write_bytes(b"")
    assert checkpoint_path(out) == os.path.join(out, "ckpt.pt") and checkpoint_path(out, sharded=True) == sharded


def test_ddp_buckets_of_gpt2_124m_are_its_blocks_exactly():
    """DDP's default 25 MiB (after a 1 MiB first bucket) split each 27.04 MiB block over two buckets
    (measured with 2 gloo ranks: 13 buckets, each but the ends holding parts of two blocks). The caps:
    ln_f with block 11, blocks 10 .. 0 one each, then wpe and the tied wte."""
    model = runtime.meta_model(dict(runtime.DEFAULTS, n_layer=12, n_head=12, n_embd=768, block_size=1024,
                                    vocab_size=50304))
    block = (12 * 768**2 + 13 * 768) * 4  # c_attn, c_proj, c_fc, mlp c_proj weights and biases, 2 LayerNorms
    assert parallel.ddp_bucket_caps_mb(model) == [(block + 2 * 768 * 4) / 2**20, *[block / 2**20] * 11,
                                                  (50304 + 1024) * 768 * 4 / 2**20]


def bucket_contents(rank, world):
    """Two ranks train a 2-layer model wrapped by the layout as train.py wraps it; a comm hook records
    which modules each all-reduced bucket held, after DDP's rebuild at the first backward."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    torch.manual_seed(0)
    cfg = dict(runtime.DEFAULTS, n_layer=2, n_head=2, n_embd=160, block_size=16, vocab_size=64, compile=False)
    raw = runtime.build_model(cfg)
    layout = ParallelLayout(world_size=world)
    layout.distributed = True
    model = layout.wrap(raw, "float32", cfg)
    module_of = {id(p): name.rsplit(".", 1)[0].removeprefix("transformer.").split(".")[:2]
                 for name, p in raw.named_parameters()}
    seen = []

    def record(state, bucket):
        seen.append(sorted({".".join(module_of[id(p)]) for p in bucket.parameters()}))
        return allreduce_hook(state, bucket)

    model.register_comm_hook(None, record)
    idx = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(rank))
    for _ in range(2):
        seen.clear()
        model(idx, idx)[1].backward()
    assert seen == [["h.1", "ln_f"], ["h.0"], ["wpe", "wte"]], seen


def test_ddp_all_reduces_each_block_in_a_bucket_of_its_own(tmp_path):
    run_ranks(bucket_contents, 2, tmp_path)


def test_blocks_under_ddps_first_bucket_keep_its_default_buckets():
    """A CPU twin's blocks (64 wide: 0.19 MiB) stay under DDP's 1 MiB first bucket, below which Dynamo's
    DDP graph splitting refuses a compiled model: DDP's default buckets instead (test_model compiles one)."""
    model = runtime.meta_model(dict(runtime.DEFAULTS, n_layer=4, n_head=4, n_embd=64, block_size=256, vocab_size=65))
    assert parallel.ddp_bucket_caps_mb(model) is None
