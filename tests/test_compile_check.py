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


# GPT-2's head size, and its double inside mix (RDNA3 splits it into two programs of 64 columns)
# and the mask-free specialization (EVEN) that GPT-2's T = 1024 takes on the H100 (ra_attention.mask_free_tiles),
# with the pointer loads and with TMA's (ra_attention.tma_loads)
SPECS = [("sm90", 64, "masked"), ("sm90", 128, "masked"), ("sm90", 64, "even"), ("sm90", 64, "tma"),
         ("gfx1100", 64, "masked"), ("gfx1100", 128, "masked"),
         ("gfx942", 128, "masked")]  # MI300X: whole rows at 128, its own lists
# one process compiles every spec (each fresh interpreter's torch and triton imports cost ~4 CPU-seconds),
# so the tests that read it share a worker
pytestmark = pytest.mark.xdist_group("compile_check")


def _unavailable(target):
    """(what, how) where the compiler that the target needs is not installed, else None."""
    if target.startswith("sm") and not (os.environ.get("TRITON_PTXAS_PATH") or shutil.which("ptxas")):
        return "ptxas", "install CUDA's ptxas (pip install nvidia-cuda-nvcc) or set TRITON_PTXAS_PATH"
    if target.startswith("gfx") and importlib.util.find_spec("triton.backends.amd") is None:
        return "Triton's AMD backend", "install the triton wheel that ships backends/amd"
    return None


@pytest.fixture(scope="module")
def usage(request):
    """{(target, head size, spec): [[kernel, mode, compile_check.compile_one's usage], ...]} for every spec
    this session tests whose compiler is installed, from one fresh process without TRITON_INTERPRET (Triton
    binds interpreter mode at import); spec: 'masked', 'even' (the mask-free specialization, EVEN) or 'tma'
    (EVEN with TMA loads)."""
    selected = [item.callspec.params for item in request.session.items if item.module is request.module]
    specs = [spec for spec in SPECS if _unavailable(spec[0]) is None
             and dict(zip(("target", "head_size", "spec"), spec)) in selected]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = ("import json; from kernels import compile_check, ra_attention; "
            "print(json.dumps([(target, head_size, spec, [(kernel, mode, compile_check.compile_one("
            "target, kernel, mode, 'bfloat16', head_size, "
            "ra_attention.autotune_space(target, head_size, mode.startswith('mix'))[index][0], "
            "spec != 'masked', spec == 'tma')) "
            f"for kernel, mode, index in {KERNELS} if compile_check.runs(kernel, mode, target, head_size)]) "
            f"for target, head_size, spec in {specs}]))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    return {(target, head_size, spec): compiled
            for target, head_size, spec, compiled in json.loads(out.stdout.strip().splitlines()[-1])}


@pytest.mark.parametrize("target,head_size,spec", SPECS)
def test_the_conservative_configs_do_not_spill(target, head_size, spec, usage):
    missing = _unavailable(target)
    if missing:
        what, how = missing
        if os.environ.get("CI"):
            pytest.fail(f"{what} is missing in CI: {how}")
        pytest.skip(f"{what} is not available: {how}")
    for kernel, mode, used in usage[target, head_size, spec]:
        assert used["tma"] == (spec == "tma"), (kernel, mode, used)  # the descriptor loads became TMA copies
        assert used["spills"] <= KNOWN_SPILLS.get((target, head_size, kernel, mode), 0), (target, head_size, kernel,
                                                                                         mode, used)
        if kernel == "fwd":
            assert MATRIX[target] in used["mma"], (target, head_size, mode, used)
        assert 0 < used["registers"] <= (512 if target == "gfx942" else 256) and 0 < used["shared"] <= SHARED_LIMIT[target], (kernel, mode, used)
