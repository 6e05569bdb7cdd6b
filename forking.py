"""Warmup-and-fork: a run (a branch) that starts from another run's final checkpoint (its trunk).

A suite with `fork_at` (sweep.py) trains the baseline once per seed to that step, then every variant
continues from it: the branch's own model takes every trunk tensor of the same name and shape,
parameters only the variant has (those its model lists in `fork_new_parameters`: RA's alphas and
gates, an output gate) keep the branch's own seeded initialization, the optimizer state of the
shared parameters is carried (fork_optimizer='fresh' starts it empty), the data stream goes on at
the trunk's iteration (batches are a function of data seed and iteration) and the learning rate
follows the one schedule of the whole budget (the trunk ran it with the branch's decay length).
A branch identical to the baseline reproduces the baseline's own continuation bit for bit.
"""
import copy
import os
from typing import NamedTuple

import configurator
import rundir
import runtime
from model import LayerNorm, model_config_fields, unwrap_state_dict


FORK_OPTIMIZER = ("carry", "fresh")
# Keys a branch may set apart from its trunk: where and how it is logged, evaluated and stopped,
# its model (its own architecture, checked tensor by tensor) and its batch order after the fork. Every other key is the training
# recipe, which the fork continues and so must be the trunk's.
FREE_KEYS = ("out_dir", "init_from", "allow_data_change", "fork_from", "fork_optimizer", "fork_start", "eval_interval",
             "eval_at", "eval_iters", "final_eval_iters", "log_interval", "save_checkpoint", "sample_tokens", "hellaswag_interval",
             "hellaswag_limit", "hellaswag_input", "max_iters", "max_time", "max_tokens", "lr_decay_iters", "device",
             "compile", "dist_timeout", "log_act_norm_layers", "wandb_log", "wandb_project", "wandb_run_name",
             "wandb_group", "wandb_mode", "model_type", "data_order")


def model_keys():
    return {k for _, config_cls in runtime.MODEL_TYPES.values() for k in model_config_fields(config_cls)}


def recipe_differences(cfg, trunk_cfg):
    """{key: (branch value, trunk value)} of the training recipe, with the schedule's decay length
    compared as resolved (a branch's 0 means its own max_iters)."""
    keys = (set(cfg) | set(trunk_cfg)) - set(FREE_KEYS) - model_keys()
    diffs = {k: (cfg.get(k), trunk_cfg.get(k)) for k in sorted(keys) if cfg.get(k) != trunk_cfg.get(k)}
    if runtime.decay_iters(cfg) != runtime.decay_iters(trunk_cfg):
        diffs["lr_decay_iters"] = (runtime.decay_iters(cfg), runtime.decay_iters(trunk_cfg))
    return diffs


def read_trunk(cfg):
    """The trunk's final checkpoint, checked before anything is built: the trunk finished and is no
    branch itself, it ended before this run's budget, its checkpoint is readable (its digest holds)
    and ends where the trunk ended, its recipe is the branch's. Each problem is one line naming the trunk."""
    trunk = cfg["fork_from"]
    err = configurator.ConfigError
    retrain = f"delete {trunk} and run the suite again to retrain the trunk"
    status = rundir.run_status(rundir.read_events(trunk)) if os.path.isdir(trunk) else "missing"
    if status != "finished":
        raise err(f"fork_from={trunk!r}: the trunk is {status}, not finished: run it to its end first "
                  f"(sweep.py runs a suite's trunks before their branches)")
    events = rundir.read_events(trunk)
    source = next((e.get("trunk") for e in events if e["event"] == "fork"), None)
    if source is not None:
        raise err(f"fork_from={trunk!r} is itself a branch (forked from {source}), holding its own model's weights: "
                  f"fork from a trunk, a run trained from scratch")
    last = rundir.finished(events)[-1]["iter"]
    if last >= runtime.last_iter(cfg):
        raise err(f"fork_from={trunk!r}: the trunk ended at iteration {last}, at or after this run's last "
                  f"({runtime.last_iter(cfg)}), so nothing would be trained: fork from a trunk stopped earlier, "
                  f"or give this run a larger budget")
    path = os.path.join(trunk, rundir.CHECKPOINT_FILE)
    if not os.path.exists(path):
        raise err(f"fork_from={trunk!r}: the trunk has no {rundir.CHECKPOINT_FILE} (it ran with save_checkpoint=False "
                  f"or sharded): {retrain}")
    try:
        ckpt = rundir.load_checkpoint_file(path)
    except rundir.RunDirError as e:
        raise rundir.RunDirError(f"the trunk checkpoint is damaged: {e}; or {retrain}") from None
    if ckpt.get("iter_num") != last or "param_names" not in ckpt:
        raise rundir.RunDirError(f"the trunk checkpoint {path} is at iteration {ckpt.get('iter_num')}, not the trunk's "
                                 f"last ({last}), or was written before forks existed: {retrain}")
    diffs = recipe_differences(cfg, ckpt["config"])
    if diffs:
        listed = ", ".join(f"{k}: branch {a!r} vs trunk {b!r}" for k, (a, b) in diffs.items())
        raise err(f"fork_from={trunk!r}: the branch's training recipe differs from its trunk's ({listed}): a fork "
                  f"continues the trunk's training, so only the model and the run's bookkeeping may differ")
    return ckpt


class Loaded(NamedTuple):
    """load_weights' count of tensors: taken from the trunk, and the branch's own new ones."""
    loaded: int
    new: int


def load_weights(ckpt, model, assign=False):
    """The trunk's tensors into the branch's model (built with its own seeded initialization):
    every tensor the two share in name and shape; the branch's extra parameters must be ones its
    model declares new. assign: the branch takes the trunk's tensors themselves, not copies into its
    own (a model on the meta device takes them so). Returns the Loaded counts (the optimizer state and
    the position follow in parallel.Checkpointer.continue_trunk)."""
    trunk = unwrap_state_dict(ckpt["model"])
    own = model.state_dict()
    check_tensors({n: t.shape for n, t in trunk.items()}, model, f"fork_from={ckpt['config']['out_dir']!r}")
    model.load_state_dict({**own, **{n: trunk[n] for n in own if n in trunk}}, assign=assign)
    return Loaded(len(own) - len(set(own) - set(trunk)), len(set(own) - set(trunk)))


def check_tensors(trunk, model, where):
    """The branch's model can take the trunk's tensors ({name: shape}): it keeps every one in its
    shape, and its extra tensors are ones it declares new; else one line naming them."""
    own = {n: t.shape for n, t in model.state_dict().items()}
    allowed_new = set(model.fork_new_parameters()) if hasattr(model, "fork_new_parameters") else set()
    dropped = [n for n in trunk if n not in own]
    reshaped = [f"{n} {tuple(trunk[n])} -> {tuple(own[n])}" for n in own if n in trunk and trunk[n] != own[n]]
    unexplained = [n for n in own if n not in trunk and n not in allowed_new]
    if dropped or reshaped or unexplained:
        what = "; ".join(f"{label}: {', '.join(names[:3])}" + (" ..." if len(names) > 3 else "")
                         for label, names in (("trunk tensors the branch lacks", dropped),
                                              ("other shapes", reshaped),
                                              ("branch tensors neither in the trunk nor new", unexplained)) if names)
        raise configurator.ConfigError(f"{where}: the branch's model cannot continue the trunk's ({what}); fork only "
                                       f"variants whose model keeps the baseline's tensors and declares its additions "
                                       f"(fork_new_parameters)")


def check_models_fork(branch_cfg, trunk_cfg, where):
    """Before any run (sweep.py's fork plan): the branch's model takes the trunk's tensors and, with
    fork_start='preserve', has a preserving start for each new parameter; both models on the meta
    device (shapes only: no memory, no weights, no time)."""
    trunk, branch = runtime.meta_model(trunk_cfg), runtime.meta_model(branch_cfg)
    check_tensors({n: t.shape for n, t in trunk.state_dict().items()}, branch, where)
    if branch_cfg["fork_start"] == "preserve":
        try:
            preserve_start(branch)
        except configurator.ConfigError as e:
            raise configurator.ConfigError(f"{where}: {e}") from None


_verdicts = {}  # (trunk's model_key, branch's model_key, fork_start) -> starts_as_trunk's answer


def starts_as_trunk(branch_cfg, trunk_cfg, random_trunks=None):
    """None when a branch of branch_cfg, forked from a trunk of trunk_cfg (its tensors loaded, its
    fork_start applied), computes the trunk's function at the fork; else why not, in words. Checked
    on the CPU with random trunk weights and tokens: a branch that starts elsewhere makes a forked
    verdict measure the jump at the fork, not the idea (sweep.py refuses it before any run). Answered
    once per process for each pair of models: suites and their sizes share pairs. random_trunks: a dict
    the caller keeps over its checks (sweep.py's plan), holding the last trunk built for the next branch
    of the same trunk model (a ladder's variants at one size)."""
    on_cpu = lambda cfg: dict(cfg, device="cpu", dtype="float32", compile=False, init_from="scratch", dropout=0.0)
    key = (runtime.model_key(on_cpu(trunk_cfg)), runtime.model_key(on_cpu(branch_cfg)), branch_cfg.get("fork_start"))
    if key not in _verdicts:
        random_trunks = {} if random_trunks is None else random_trunks
        if key[0] not in random_trunks:
            random_trunks.clear()  # one at a time: a 774M trunk holds 3 GiB
            random_trunks[key[0]] = random_trunk(on_cpu(trunk_cfg))
        _verdicts[key] = fork_gap(on_cpu(branch_cfg), random_trunks[key[0]])
    return _verdicts[key]


class RandomTrunk(NamedTuple):
    """A trunk for starts_as_trunk: its config, its model with random weights, tokens and its logits on them."""
    cfg: dict
    model: object
    tokens: object
    logits: object


def random_trunk(cfg):
    """A RandomTrunk of cfg's model, its weights of a trained model's scale (every tensor N(0, 0.1), a
    LayerNorm's gain N(1, 0.1)) drawn directly: its own initialization, which they replace, was most of the
    check's time at GPT-2 sizes."""
    import torch
    trunk = empty_model(cfg).eval()
    with torch.no_grad():  # trained-sized weights: at init attention is near uniform and hides what a variant changes
        gains = {id(m.weight) for m in trunk.modules() if isinstance(m, LayerNorm)}
        generator = torch.Generator().manual_seed(0)
        for p in trunk.parameters():
            p.normal_(1.0 if id(p) in gains else 0.0, 0.1, generator=generator)
        # one sequence of 16 positions shows a changed function as well as more would: at GPT-2 sizes the forward
        # over the weights is the check's cost, so its tokens are few
        tokens = torch.randint(0, cfg["vocab_size"], (1, min(cfg["block_size"], 16)), generator=generator)
        return RandomTrunk(cfg, trunk, tokens, trunk(tokens)[0])


def fork_gap(branch_cfg, trunk):
    """starts_as_trunk's check of one branch against a random_trunk. A branch without new parameters takes the
    trunk's tensors themselves (no copy, nothing drawn); one with new parameters is built with its own seeded
    initialization, which they keep, and takes copies (preserve_start scales c_proj, and the trunk serves the
    next branch as it is)."""
    import torch
    branch = branch_at_init(branch_cfg)
    with torch.no_grad():
        load_weights(dict(model=trunk.model.state_dict(), config=trunk.cfg), branch,
                     assign=next(branch.parameters()).is_meta)
        if branch_cfg.get("fork_start") == "preserve":
            preserve_start(branch)  # one it does not have is refused with the tensors (check_models_fork)
        gap = (branch.eval()(trunk.tokens)[0] - trunk.logits).abs().max().item()
    if not gap <= 1e-4:  # NaN logits prove nothing: refused too
        how = "with fork_start='preserve'" if branch_cfg.get("fork_start") == "preserve" else \
            "with fork_start='own' (its new parameters at their own init)"
        return f"its logits differ from the trunk's by up to {gap:.3g} at the fork {how}"
    return None


def empty_model(cfg):
    """The run's model on the CPU with its tensors allocated, not filled (nothing drawn): the meta model's
    copy, each parameter given storage once, so that tied weights stay one (Module.to_empty unties them)."""
    import torch
    model = copy.deepcopy(runtime.meta_model(cfg))
    allocated = {}
    for name, p in list(model.named_parameters(remove_duplicate=False)):
        module, _, attr = name.rpartition(".")
        if id(p) not in allocated:
            allocated[id(p)] = torch.nn.Parameter(torch.empty_like(p, device="cpu"), requires_grad=p.requires_grad)
        setattr(model.get_submodule(module), attr, allocated[id(p)])
    return model


def branch_at_init(cfg):
    """The branch before its trunk's tensors: with new parameters, built with its own seeded initialization,
    which they keep at the fork; without, on the meta device (every tensor comes from the trunk, check_tensors)."""
    import torch
    model = runtime.meta_model(cfg)
    if not getattr(model, "fork_new_parameters", list)():
        return copy.deepcopy(model)
    with torch.random.fork_rng():
        torch.manual_seed(1)
        return runtime.build_model(cfg)


def preserve_start(model):
    """fork_start='preserve': set the branch's new parameters (after load_weights) so that the forked
    model computes what the trunk computed, as far as its architecture allows; each module that owns
    new parameters says how (its `preserve_fork_start`, e.g. ra_model.GatedOutput). A new parameter
    no module can start that way is refused in one line. Returns the modules' notes (what they did
    and what remains different)."""
    new = set(model.fork_new_parameters()) if hasattr(model, "fork_new_parameters") else set()
    notes, covered = [], set()
    for prefix, module in model.named_modules():
        if hasattr(module, "preserve_fork_start"):
            names, note = module.preserve_fork_start()
            covered |= {f"{prefix}.{n}" if prefix else n for n in names}
            if note:
                notes.append(note)
    left = sorted(new - covered)
    if left:
        raise configurator.ConfigError(f"fork_start='preserve': no function-preserving start is known for "
                                       f"{', '.join(left[:3])}{' ...' if len(left) > 3 else ''}: fork with "
                                       f"fork_start='own' (the report shows the loss jump at the fork) or run the "
                                       f"variant from scratch")
    return sorted(set(notes))
