"""Compile the RA kernels for a GPU target without a GPU: proves they build for NVIDIA and AMD,
and shows the register spills (AMD) or shared memory (NVIDIA) of each autotune configuration.

    python kernels/compile_check.py --target gfx1100          # RDNA3 (W7900): the AMD lists
    python kernels/compile_check.py --target sm90 --D 128     # H100: registers, spills, shared memory

NVIDIA targets go to PTX, which ptxas (CUDA's assembler: TRITON_PTXAS_PATH or PATH) turns into
a cubin reporting registers per thread and spill bytes; AMD targets go to AMDGCN assembly, whose
metadata gives the VGPR spill count. Each
(kernel, configuration) compiles in a child process, because the AMD backend can crash outright
(it segfaults on the column kernel with num_stages=1 for gfx1100, triton 3.8). This uses
Triton's compiler internals (ASTSource, stages), which change between releases: written for
triton 3.8.
"""

import argparse
import multiprocessing as mp
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # repo root

import kernels.ra_attention as ra  # noqa: E402

KERNELS = {"fwd": "_ra_fwd_kernel", "col": "_ra_bwd_col_kernel", "row": "_ra_bwd_row_kernel"}
FP32_POINTERS = {"Alpha", "L", "Delta", "DQ", "DK", "DV", "DAlpha"}
SCALARS = {"H", "T", "D", "W", "T_BUCKET", "n_partials"}


def compile_one(target_name, kernel, mode, dtype, block_d, config):
    """Returns a short report string, or raises."""
    import triton.language as tl
    from triton._C.libtriton import ir
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import ASTSource, make_backend

    if target_name.startswith("sm"):
        target, last = GPUTarget("cuda", int(target_name[2:]), 32), "ptx"
    else:
        target, last = GPUTarget("hip", target_name, 32 if target_name.startswith("gfx11") else 64), "amdgcn"
    fn = getattr(ra, KERNELS[kernel])
    block_m, block_n, warps, stages = config
    constants = dict(MIX=mode == "mix", ACC=tl.float32, DOT=getattr(tl, dtype), PRECISION="ieee",
                     BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d)
    ptr = {"bfloat16": "*bf16", "float16": "*fp16", "float32": "*fp32"}[dtype]
    signature = {}
    for name in fn.arg_names:
        if name in constants:
            signature[name] = "constexpr"
        elif name == "scale":
            signature[name] = "fp32"
        elif name.startswith("stride") or name in SCALARS:
            signature[name] = "i32"
        else:
            signature[name] = "*fp32" if name in FP32_POINTERS else ptr
    backend = make_backend(target)
    options = backend.parse_options({"num_warps": warps, "num_stages": stages})
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    source = ASTSource(fn, signature, constants)
    module = source.make_ir(target, options, backend.get_codegen_implementation(options),
                            backend.get_module_map(), context)
    stages_ = {}
    backend.add_stages(stages_, options, source.language)
    metadata = {"hash": "compile_check", "target": target, **options.__dict__}
    for name, stage in stages_.items():
        module = stage(module, metadata)
        if name == last:
            break
    if last == "amdgcn":
        vgprs = re.search(r"\.vgpr_count:\s+(\d+)", module).group(1)
        spills = re.search(r"\.vgpr_spill_count:\s+(\d+)", module).group(1)
        return f"vgprs {vgprs:>3}, vgpr spills {spills:>5}, shared {metadata.get('shared', 0):>6} B"
    return f"{ptxas_usage(module, target.arch)}, shared {metadata.get('shared', 0):>6} B"


def ptxas_usage(ptx, arch):
    """Registers per thread and spill bytes from `ptxas -v` (the one Triton uses: TRITON_PTXAS_PATH,
    else ptxas on PATH); shared memory is dynamic in Triton kernels, so it comes from Triton's metadata."""
    ptxas = os.environ.get("TRITON_PTXAS_PATH") or shutil.which("ptxas")
    if not ptxas:
        return "registers ? (no ptxas: set TRITON_PTXAS_PATH or install nvidia-cuda-nvcc)"
    suffix = "a" if arch == 90 else ""  # Triton targets sm_90a on H100
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "kernel.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        out = subprocess.run([ptxas, "-v", f"--gpu-name=sm_{arch}{suffix}", src, "-o", os.path.join(tmp, "k.cubin")],
                             capture_output=True, text=True, check=True).stderr
    registers = re.search(r"Used (\d+) registers", out).group(1)
    spills = re.search(r"(\d+) bytes spill stores", out).group(1)
    return f"registers {registers:>3}, spill bytes {spills:>5}"


def child(queue, *args):
    try:
        queue.put(compile_one(*args))
    except Exception as e:  # report, do not stop the sweep
        queue.put(f"FAILED {type(e).__name__}: {str(e)[:200]}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="gfx1100", help="sm80, sm90, gfx1100, gfx942 ...")
    parser.add_argument("--modes", nargs="+", default=["mix", "gate"], choices=ra.MODES)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--D", type=int, default=64, help="head size (padded to a power of two)")
    args = parser.parse_args()
    block_d = max(16, 1 << (args.D - 1).bit_length())
    spaces = dict(zip(KERNELS, ra.autotune_space(hip=not args.target.startswith("sm"))))
    failures = 0
    ctx = mp.get_context("spawn")
    for kernel, configs in spaces.items():
        for config in configs:
            for mode in args.modes:
                queue = ctx.Queue()
                proc = ctx.Process(target=child, args=(queue, args.target, kernel, mode, args.dtype, block_d, config))
                proc.start()
                proc.join()
                result = queue.get() if proc.exitcode == 0 else f"FAILED: compiler process exit code {proc.exitcode}"
                failures += result.startswith("FAILED")
                print(f"{args.target} {kernel:<4} {mode:<8} tile {config[0]:>3}x{config[1]:<3} "
                      f"warps {config[2]} stages {config[3]}: {result}", flush=True)
    print(f"{failures} failures")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
