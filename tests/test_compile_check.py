"""The RA kernels compiled offline for the W7900 (gfx1100) and the H100 (sm90) at head sizes 64 and
128, and the MI300X (gfx942) at 128: the conservative (first) configuration of each kernel, in the
windowed single-stream and mix specializations (the most loop runs), compiles with zero register
spills and shared memory under the target's limit (sm90 at 64 also without masks, EVEN, and with
its streamed tiles loaded by TMA), and its dots use the target's matrix instructions: wgmma on
sm90's forward, MFMA on CDNA, WMMA on RDNA3 (kernels/compile_check.py)."""
import importlib.util
import json
import os
import shutil
import subprocess
import sys

import pytest

# Triton is only ever imported in the subprocesses: importing it here, before test_kernels.py swaps
# in its interpreter build, would leave this process with two half-loaded copies of its C extension.
if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_LIMIT = {"sm90": 227 * 1024, "gfx1100": 64 * 1024, "gfx942": 64 * 1024}  # bytes one block may use
# (kernel, mode, index of its list in autotune_space): swapW and mixW are the windowed specializations
KERNELS = [("fwd", "swapW", 0), ("fwd", "mixW", 0), ("col", "swapW", 1), ("col", "mixW", 1), ("colR", "mixW", 1),
           ("row", "swapW", 2), ("row", "mixW", 2)]
# Spills allowed per (target, head size, kernel, mode): none. Windowed mix's column kernel spilled
# wherever it held all three accumulators and the atomics' tiles (AMD, and sm90 at D = 128); it now
# runs as two passes there (ra_attention.recip_pass) and without atomics on RDNA3 (atomic_backward).
KNOWN_SPILLS = {}
MATRIX = {"sm90": "wgmma", "gfx942": "mfma", "gfx1100": "wmma"}  # in every forward's instructions


def _missing(what, how):
    if os.environ.get("CI"):
        pytest.fail(f"{what} is missing in CI: {how}")
    pytest.skip(f"{what} is not available: {how}")


def _compile_conservative(target, head_size, spec):
    """compile_check.compile_one for every kernel in a fresh process without TRITON_INTERPRET
    (Triton binds interpreter mode at import); spec: 'masked', 'even' (the mask-free specialization,
    EVEN) or 'tma' (EVEN with TMA loads)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = ("import json; from kernels import compile_check, ra_attention; "
            f"print(json.dumps([(kernel, mode, compile_check.compile_one({target!r}, kernel, mode, 'bfloat16', "
            f"{head_size}, ra_attention.autotune_space({target!r}, {head_size}, mode.startswith('mix'))[index][0], "
            f"{spec != 'masked'}, {spec == 'tma'})) "
            f"for kernel, mode, index in {KERNELS} if compile_check.runs(kernel, mode, {target!r}, {head_size})]))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


# GPT-2's head size, and its double inside mix (RDNA3 splits it into two programs of 64 columns)
# and the mask-free specialization (EVEN) that GPT-2's T = 1024 takes on the H100 (ra_attention.mask_free_tiles),
# with the pointer loads and with TMA's (ra_attention.tma_loads)
@pytest.mark.parametrize("target,head_size,spec", [
    ("sm90", 64, "masked"), ("sm90", 128, "masked"), ("sm90", 64, "even"), ("sm90", 64, "tma"),
    ("gfx1100", 64, "masked"), ("gfx1100", 128, "masked"),
    ("gfx942", 128, "masked")])  # MI300X: whole rows at 128, its own lists
def test_the_conservative_configs_do_not_spill(target, head_size, spec):
    if target.startswith("sm") and not (os.environ.get("TRITON_PTXAS_PATH") or shutil.which("ptxas")):
        _missing("ptxas", "install CUDA's ptxas (pip install nvidia-cuda-nvcc) or set TRITON_PTXAS_PATH")
    if target.startswith("gfx") and importlib.util.find_spec("triton.backends.amd") is None:
        _missing("Triton's AMD backend", "install the triton wheel that ships backends/amd")
    for kernel, mode, usage in _compile_conservative(target, head_size, spec):
        assert usage["tma"] == (spec == "tma"), (kernel, mode, usage)  # the descriptor loads became TMA copies
        assert usage["spills"] <= KNOWN_SPILLS.get((target, head_size, kernel, mode), 0), (target, head_size, kernel,
                                                                                          mode, usage)
        if kernel == "fwd":
            assert MATRIX[target] in usage["mma"], (target, head_size, mode, usage)
        assert 0 < usage["registers"] <= (512 if target == "gfx942" else 256) and 0 < usage["shared"] <= SHARED_LIMIT[target], (kernel, mode, usage)
