"""The RA kernels compiled offline for the H100 (sm90): each kernel, in every mode, has a
configuration that ptxas assembles with zero register spills and shared memory under the limit."""
import importlib.util
import os
import re
import shutil
import subprocess
import sys

import pytest

# Triton is only ever imported in the subprocesses: importing it here, before test_kernels.py swaps
# in its interpreter build, would leave this process with two half-loaded copies of its C extension.
if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SM90_SHARED_LIMIT = 227 * 1024  # bytes of shared memory one H100 block may use


def _have_ptxas():
    if os.environ.get("TRITON_PTXAS_PATH") or shutil.which("ptxas"):
        return True
    if os.environ.get("CI"):
        pytest.fail("ptxas is missing in CI: install CUDA's ptxas or set TRITON_PTXAS_PATH")
    pytest.skip("ptxas is not installed (TRITON_PTXAS_PATH or PATH): cannot assemble for NVIDIA")


@pytest.mark.parametrize("kernel", ["fwd", "col", "row"])
def test_the_conservative_config_of_each_kernel_does_not_spill_on_sm90(kernel):
    _have_ptxas()
    config = (32, 32, 4, 2)  # the conservative configuration every autotune list keeps
    for mode in ("gate", "mix"):  # gate and mix run the most streams at once: the most registers
        # a fresh process without TRITON_INTERPRET: Triton binds interpreter mode at import
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        report = subprocess.run(
            [sys.executable, "-c", "from kernels import compile_check, ra_attention; "
             f"assert all({config} in space for space in ra_attention.autotune_space(hip=False)); "
             f"print(compile_check.compile_one('sm90', {kernel!r}, {mode!r}, 'bfloat16', 64, {config}))"],
            cwd=REPO, env=env, capture_output=True, text=True, check=True).stdout
        registers, spills, shared = map(int, re.search(
            r"registers\s+(\d+), spill bytes\s+(\d+), shared\s+(\d+) B", report).groups())
        assert spills == 0, (mode, report)
        assert 0 < registers <= 255 and 0 < shared <= SM90_SHARED_LIMIT, (mode, report)
