"""EleutherAI's lm-evaluation-harness on the workbench's checkpoints: lm-eval's own command line, with
our model "workbench" (lm_eval_backend.py) registered first. Use it wherever lm-eval's docs say `lm_eval`.

    python lm_eval_run.py --model workbench --model_args out_dir=out-ra-late --tasks hellaswag,lambada_openai
    python lm_eval_run.py --model workbench --model_args out_dir=out-gpt2,device=cpu,dtype=float32 --tasks wikitext
    python lm_eval_run.py --model workbench --model_args out_dir=out-gpt2 --tasks my_task --include_path my_tasks/
    python lm_eval_run.py --model hf --model_args pretrained=gpt2-hf --tasks hellaswag  # an HF export, lm-eval's backend

model_args of workbench: out_dir (a run directory with ckpt.pt), or init_from (a local HF GPT-2 directory);
device ('' picks cuda when there is one), dtype ('' is the run's own), batch_size (also --batch_size),
max_gen_toks. With --model workbench and no --output_path, the results and every item's outputs
(--log_samples) go to out_dir/lm_eval/, where report.py finds them.
"""
import os
import sys

import configurator
import parallel
from ablation.lm_eval_results import RESULTS_DIR


def option(argv, name):
    """The value of `--name VALUE` or `--name=VALUE` in argv, or None."""
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def workbench_defaults(argv):
    """argv for a workbench model, completed with our defaults: the device the workbench picks
    (lm-eval's own default is cuda:0 even without a GPU) and, for a run directory, --output_path
    out_dir/lm_eval and --log_samples."""
    if option(argv, "--model") != "workbench":
        return argv
    from lm_eval.utils import simple_parse_args_string
    model_args = simple_parse_args_string(option(argv, "--model_args") or "")
    extra = []
    if option(argv, "--device") is None:
        extra += ["--device", parallel.pick_device(model_args.get("device", ""))]
    if model_args.get("out_dir") and option(argv, "--output_path") is None:
        # a path ending in .json makes lm-eval write results_<date>.json and samples_* in its directory
        extra += ["--output_path", os.path.join(model_args["out_dir"], RESULTS_DIR, "results.json")]
        if "--log_samples" not in argv and "-s" not in argv:
            extra.append("--log_samples")
    return argv + extra


def main(argv):
    if not argv or any(arg in ("-h", "--help") for arg in argv):
        print(__doc__)
    import lm_eval_backend  # noqa: F401  registers "workbench" with lm-eval
    from lm_eval.__main__ import cli_evaluate
    sys.argv = ["lm_eval", *workbench_defaults(argv)]
    import requests
    try:
        cli_evaluate()
    except (ConnectionError, requests.RequestException) as e:  # "Couldn't reach ... on the Hub", timeouts
        raise ConnectionError(
            f"the data of --tasks {option(argv, '--tasks')} is not on this machine and the Hugging Face hub cannot be "
            f"reached ({(str(e).splitlines() or [type(e).__name__])[0]}): run it once where the hub answers (HF_HOME keeps the data), or give "
            f"a task of your own with --include_path") from None


if __name__ == "__main__":
    configurator.run_script(main, FileNotFoundError, ValueError, ConnectionError)
