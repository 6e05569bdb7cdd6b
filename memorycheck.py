"""Does a run fit its device? The memory estimate per rank (sharding.memory_estimate) against the
memory there is, asked before anything is allocated: refuse a run that cannot fit, and settle
head_loss='auto' (the full head where its logits fit, else the chunked one).
"""
import dataclasses
import os

import torch

import configurator
import sharding

# head_loss='auto' takes the full head where the run's memory estimate times this fits: the tolerance
# the estimate is held to against the allocator's measured peaks (tests/test_sharding.py, gpu_check.py)
FULL_HEAD_MARGIN = 1.25


def gib(n_bytes):
    return f"{n_bytes / 2**30:,.1f} GiB"


def estimate(cfg, layout, n_params, dtype):
    """Bytes per rank (sharding.memory_estimate); a real tensor-parallel rank holds 1/tp of the weights."""
    return sharding.memory_estimate(cfg, n_params // (layout.tp if layout.tp_group is not None else 1),
                                    layout.world_size, dtype, layout.device.split(":")[0])


def available_memory(device):
    """(bytes, where): a GPU's free memory plus what this process's allocator already holds (the
    estimate counts those tensors; not the total: the CUDA context, created by now, and other
    processes' memory are not ours), or this machine's RAM shared by the ranks on it."""
    if device.startswith("cuda"):
        free = torch.cuda.mem_get_info(device)[0] + torch.cuda.memory_reserved(device)
        return free, f"the free memory of {device}"
    ranks_here = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    available = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // ranks_here
    return available, "this machine's RAM" + (f" per rank ({ranks_here} ranks)" if ranks_here > 1 else "")


def check_memory(cfg, layout, n_params, dtype):
    """Refuse a run whose estimated peak (a training step's or an evaluation's) exceeds the device's
    memory (a CPU's RAM shared by its ranks), before anything is allocated. head_loss='auto' is
    estimated as the chunked head, the one it falls back to (choose_head_loss)."""
    available, where = available_memory(layout.device)
    needed = estimate(cfg, layout, n_params, dtype)
    if needed["total"] > available:
        evaluating = needed["total"] > needed["step"]
        parts = ", ".join(f"{k} {gib(needed[k])}" for k in ("params", "grads", "optimizer", "overhead") + (
            ("evaluation",) if evaluating else ("activations", "head")))
        fix = ("lower batch_size or block_size (evaluation holds their vocab_size logits at once)" if evaluating else
               "shrink the model, lower batch_size or block_size, or turn on activation_checkpointing")
        raise configurator.ConfigError(f"this run needs at least {gib(needed['total'])} per rank ({parts}) but "
                                       f"{where} is {gib(available)}: {fix}")


@dataclasses.dataclass
class HeadChoice:
    """The head a training step uses and why: `reason` is 'as set' (head_loss was not 'auto'), 'cpu',
    'fits' or 'exceeds' (the full head's estimate x margin against `available` bytes on `device`)."""
    head_loss: str
    reason: str
    needed: float = None  # bytes: the estimate with the full head's logits, times margin
    available: int = None
    margin: float = FULL_HEAD_MARGIN
    device: str = ""


def choose_head_loss(cfg, layout, n_params, dtype, available=None):
    """The HeadChoice. head_loss='auto' takes the full head on a GPU when the memory estimate of the
    run with its logits (2 x vocab_size float32 values per token) fits the free memory (`available`,
    by default available_memory()) with FULL_HEAD_MARGIN to spare: one matmul each way, where the
    chunked head adds each chunk's weight gradient into a float32 (vocab, n_embd) buffer (its cost:
    docs/speed-and-memory.md). Otherwise, and on CPUs (where the chunked head is no slower), 'chunked'.
    Any other value is kept."""
    if cfg["head_loss"] != "auto":
        return HeadChoice(cfg["head_loss"], "as set")
    if not layout.device.startswith("cuda"):
        return HeadChoice("chunked", "cpu", device=layout.device)
    if available is None:
        available = available_memory(layout.device)[0]
    full = FULL_HEAD_MARGIN * estimate(dict(cfg, head_loss="full"), layout, n_params, dtype)["total"]
    fits = full <= available
    return HeadChoice("full" if fits else "chunked", "fits" if fits else "exceeds", full, available,
                      device=layout.device)
