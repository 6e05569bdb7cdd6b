"""Compile the RA kernels for a GPU target without a GPU: registers, spills, shared memory and
matrix instructions of every (kernel, mode, autotune configuration), and the occupancy they allow.

    python kernels/compile_check.py --target gfx1100 --D 64    # RDNA3 (W7900): the AMD lists
    python kernels/compile_check.py --target sm90 --D 128      # H100: the NVIDIA lists
    python kernels/compile_check.py --target sm90 --tma        # EVEN with the streamed tiles by TMA

NVIDIA targets go to PTX, which ptxas (CUDA's assembler: TRITON_PTXAS_PATH or PATH) turns into
a cubin reporting registers per thread and spill bytes; the PTX tells whether the dots became
Hopper's wgmma (warpgroup MMA) or Ampere-style mma.sync, and whether tiles arrive by TMA copies
(cp.async.bulk.tensor). AMD targets go to AMDGCN assembly, whose
metadata gives VGPRs and VGPR spills, and whose instructions tell MFMA (CDNA) from WMMA (RDNA3).
The kernels are specialized as a launch on real tensors specializes them (16-byte aligned
pointers, strides divisible by 16). Modes: `swap` stands for every single-stream launch without a
band (standard, swap, gate's first stream), `swapW` for one with a band (windowed swap and gate),
`mix` and `mixW` for mix without and with a band (each a specialization of its own: the band
adds loop runs). Kernels: fwd, col (the column backward, with atomics where the target's default
backward adds them: ra_attention.atomic_backward), colR (mix's alpha R half, where the target runs
it as a pass of its own: ra_attention.recip_pass; col is then the S half), row (the deterministic
path's row launch; its column launches are col and colR without the atomics). Each compile runs
in a child process, because the AMD backend can crash outright. This uses Triton's compiler internals (ASTSource,
stages), which change between releases: written for triton 3.8.
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

# kernel name: (function, extra constants, index of its list in autotune_space)
KERNELS = {"fwd": ("_ra_fwd_kernel", {}, 0), "col": ("_ra_bwd_col_kernel", {"ATOMIC": True}, 1),
           "colR": ("_ra_bwd_col_kernel", {"ATOMIC": True, "GRADS": 2}, 1), "row": ("_ra_bwd_row_kernel", {}, 2)}
MODES = {"swap": (False, False), "swapW": (False, True), "mix": (True, False), "mixW": (True, True)}  # MIX, BAND
FP32_POINTERS = {"Alpha", "L", "Delta", "DA", "DB", "DV", "DAlpha"}
SCALARS = {"H", "T", "D", "W", "T_BUCKET"}


def compile_one(target_name, kernel, mode, dtype, block_d, config, even=False, tma=False):
    """{"registers", "spills", "shared", "mma", "tma"} of one compiled kernel (spills: bytes on NVIDIA,
    VGPRs on AMD; mma: the matrix instructions its dots use, e.g. 'wgmma', 'mma.sync', 'mfma', 'wmma',
    'none'; tma: whether the PTX copies tiles by TMA, cp.async.bulk.tensor). even: the mask-free
    specialization (EVEN) that a launch takes when T is a multiple of the tile; tma: EVEN with the
    streamed tiles loaded through tensor descriptors (TMA, sm90)."""
    import triton.language as tl
    from triton._C.libtriton import ir
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import ASTSource, make_backend

    if target_name.startswith("sm"):
        target, last = GPUTarget("cuda", int(target_name[2:]), 32), "ptx"
    else:
        target, last = GPUTarget("hip", target_name, 32 if target_name.startswith("gfx11") else 64), "amdgcn"
    name, extra, _ = KERNELS[kernel]
    fn = getattr(ra, name)
    block_m, block_n, warps, stages = config
    mix, band = MODES[mode]
    if kernel == "col":  # the S half alone where mix's backward runs two passes
        extra = dict(extra, GRADS=1 if mix and ra.recip_pass(target_name, block_d, band) else 3)
    if kernel in ("col", "colR"):  # the row halves by atomics where the target's default backward adds them
        extra = dict(extra, ATOMIC=ra.atomic_backward(target_name))
    constants = dict(MIX=mix, BAND=band, SPLIT=ra.split_loops(target_name), **extra, ACC=tl.float32,
                     DOT=getattr(tl, dtype), PRECISION="ieee", BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d,
                     BLOCK_DC=ra.head_chunk(block_d, target_name), EVEN=even or tma, TMA=tma)
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
    # what a launch on real tensors specializes: 16-byte aligned pointers (AMD: buffer loads, as
    # tensors under 2 GB get), strides and head size divisible by 16
    aligned = [["tt.divisibility", 16]]
    attrs = {(i,): aligned + ([["tt.pointer_range", 32]] if target.backend == "hip" else [])
             for i, name in enumerate(fn.arg_names) if signature[name].startswith("*")}
    attrs.update({(fn.arg_names.index(name),): aligned for name in ("stride_b", "stride_h", "stride_t", "D")
                  if block_d % 16 == 0})
    backend = make_backend(target)
    options = backend.parse_options({"num_warps": warps, "num_stages": stages, **ra.cdna_knobs(target_name, KERNELS[kernel][2])})
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    source = ASTSource(fn, signature, constants, attrs)
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
        registers = int(re.search(r"\.vgpr_count:\s+(\d+)", module).group(1))
        spills = int(re.search(r"\.vgpr_spill_count:\s+(\d+)", module).group(1))
    else:
        registers, spills = ptxas_usage(module, target.arch)
    return dict(registers=registers, spills=spills, shared=metadata.get("shared", 0), mma=matrix_instructions(module),
                tma=re.search(r"\bcp\.async\.bulk\.tensor", module) is not None)


def matrix_instructions(asm):
    """The matrix instructions in PTX or AMDGCN text, '+'-joined, or 'none' (the dots ran on FMAs)."""
    found = [name for name, pattern in (("wgmma", r"\bwgmma\.mma_async"), ("mma.sync", r"\bmma\.sync"),
                                        ("mfma", r"\bv_mfma_"), ("wmma", r"\bv_wmma_"))
             if re.search(pattern, asm)]
    return "+".join(found) or "none"


def ptxas_usage(ptx, arch):
    """Registers per thread and spill bytes from `ptxas -v` (the one Triton uses: TRITON_PTXAS_PATH,
    else ptxas on PATH); shared memory is dynamic in Triton kernels, so it comes from Triton's metadata."""
    ptxas = os.environ.get("TRITON_PTXAS_PATH") or shutil.which("ptxas")
    if not ptxas:
        raise RuntimeError("no ptxas: set TRITON_PTXAS_PATH or install nvidia-cuda-nvcc")
    suffix = "a" if arch == 90 else ""  # Triton targets sm_90a on H100
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "kernel.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        out = subprocess.run([ptxas, "-v", f"--gpu-name=sm_{arch}{suffix}", src, "-o", os.path.join(tmp, "k.cubin")],
                             capture_output=True, text=True, check=True).stderr
    return int(re.search(r"Used (\d+) registers", out).group(1)), int(re.search(r"(\d+) bytes spill stores", out).group(1))


# Per target: (register file per SIMD lane or per SM, allocation granule, most warps/waves, shared
# memory per WGP or SM, per-block reservation). RDNA3 (Navi 31): 1536 VGPRs per lane in wave32,
# allocated in 24s, at most 16 waves per SIMD, 128 KB LDS per WGP (4 SIMDs). NVIDIA: 65,536
# registers per SM allocated per warp in 256s, at most 64 warps (sm80, sm90), 164 / 228 KB shared.
LIMITS = {"gfx1100": (1536, 24, 16, 128 * 1024, 0), "sm80": (65536, 256, 64, 164 * 1024, 1024),
          "sm90": (65536, 256, 64, 228 * 1024, 1024)}


def occupancy(target, warps, registers, shared):
    """Resident warps per SIMD (AMD) or per SM (NVIDIA) allowed by registers and shared memory."""
    regs, granule, most, smem, reserved = LIMITS[target]
    if target.startswith("gfx"):  # waves of one block spread over the WGP's 4 SIMDs
        by_regs = min(most, regs // (-(-registers // granule) * granule))
        by_smem = smem // shared * warps / 4 if shared else most
        return min(by_regs, by_smem)
    per_warp = -(-registers * 32 // granule) * granule
    blocks = min(regs // per_warp // warps, smem // (shared + reserved), 32)
    return blocks * warps


def child(queue, *args):
    try:
        queue.put(compile_one(*args))
    except Exception as e:  # report, do not stop the sweep
        queue.put(f"FAILED {type(e).__name__}: {str(e)[:200]}")


def compile_in_child(*args):
    """compile_one in a fresh process; a string saying why on failure or crash."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=child, args=(queue, *args))
    proc.start()
    proc.join()
    return queue.get() if proc.exitcode == 0 else f"FAILED: compiler process exit code {proc.exitcode}"


def runs(kernel, mode, target, block_d):
    """Whether a launch runs this kernel in this specialization on the target (colR: mix's pass)."""
    mix, band = MODES[mode]
    return kernel != "colR" or (mix and ra.recip_pass(target, block_d, band))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="gfx1100", help="sm80, sm90, gfx1100, gfx942 ...")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--D", type=int, default=64, help="head size (padded to a power of two)")
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--first", action="store_true", help="only the first (conservative) configuration of each list")
    parser.add_argument("--even", action="store_true",
                        help="the mask-free specialization (T a multiple of the tile, D a power of two: EVEN)")
    parser.add_argument("--tma", action="store_true",
                        help="EVEN with the streamed tiles loaded by TMA descriptors (TMA; sm90)")
    args = parser.parse_args()
    args.even = args.even or args.tma
    block_d = max(16, 1 << (args.D - 1).bit_length())
    if args.even and not ra.mask_free_tiles(args.target, block_d):
        print(f"{args.target} at D={args.D} does not take EVEN (ra_attention.mask_free_tiles)", flush=True)
    if args.tma and not ra.tma_loads(args.target):
        print(f"{args.target} has no TMA (ra_attention.tma_loads)", flush=True)
    spill_unit = "bytes" if args.target.startswith("sm") else "VGPRs"
    failures, spilled, compiled, chosen = 0, 0, 0, []
    for kernel, (_, _, index) in KERNELS.items():
        for mode in [m for m in args.modes if runs(kernel, m, args.target, block_d)]:
            free = []
            space = ra.autotune_space(args.target, block_d, MODES[mode][0])[index]
            for config in space[:1] if args.first else space:
                result = compile_in_child(args.target, kernel, mode, args.dtype, block_d, config, args.even, args.tma)
                line = (f"{args.target} {kernel:<3} {mode:<5} tile {config[0]:>3}x{config[1]:<3} warps {config[2]} "
                        f"stages {config[3]}: ")
                if isinstance(result, str):
                    failures += 1
                    print(line + result, flush=True)
                    continue
                compiled += 1
                spilled += result["spills"] > 0
                print(line + f"registers {result['registers']:>3}, spills {result['spills']:>5} {spill_unit}, "
                      f"shared {result['shared']:>6} B, {result['mma']}{', TMA copies' if result['tma'] else ''}",
                      flush=True)
                if result["spills"] == 0:
                    free.append((config, result))
            chosen.append((kernel, mode, free[0] if free else None))
    unit = "waves/SIMD" if args.target.startswith("gfx") else "warps/SM"
    print(f"\nfirst spill-free configuration of each list, {args.target}, D={args.D}, {args.dtype}"
          f"{', TMA' if args.tma else ', EVEN' if args.even else ''}:")
    print(f"| kernel | mode | tile | warps | stages | registers | spills | shared (B) | {unit} | matrix instr. |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for kernel, mode, found in chosen:
        if found is None:
            print(f"| {kernel} | {mode} | none spill-free | | | | | | | |")
            continue
        (m, n, warps, stages), r = found
        occ = f"{occupancy(args.target, warps, r['registers'], r['shared']):g}" if args.target in LIMITS else "?"
        print(f"| {kernel} | {mode} | {m}x{n} | {warps} | {stages} | {r['registers']} | 0 | {r['shared']} | {occ} "
              f"| {r['mma']} |")
    missing = sum(found is None for *_, found in chosen)
    print(f"{failures} failures, {spilled} of {compiled} configurations spill, "
          f"{missing} of {len(chosen)} kernels without a spill-free configuration")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
