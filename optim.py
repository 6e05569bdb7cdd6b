"""Optimizer extras and pruning baselines: AdamW-SPAM, magnitude and Adam-state pruning.

    python train.py config/train_gpt2_adamwspam_magnitude50.py
    python train.py config/train_gpt2_adamwprune_bitter7_50.py

runtime.validate calls `validate` at start-up; train.py calls `build_optimizer` for every
`optimizer` key and, when `pruning` is not 'none', a `Pruner` around the optimizer step:

    pruner.mask_grads()            after backward, before clipping: masked weights get no gradient
    optimizer.step()
    pruner.step(iter_num)          re-apply the masks; recompute them on the schedule

Formulas and schedules: docs/experiments.md ("Pruning: scores and the sparsity ramp", "AdamW-SPAM").
Every extra state (SPAM's gradient-norm history and reset clock, the masks) is in a state_dict, so a
resumed run continues exactly.
"""
import math
import re

import torch

import configurator

OPTIMIZERS = ("sgd", "adam", "adamw", "adamw_spam")
PRUNINGS = ("none", "magnitude", "state")
PRUNE_RAMPS = ("linear", "cubic")
PRUNE_THRESHOLDS = ("exact", "sampled")
ADAM_STATES = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")
EPS = 1e-8
# optimizer_impl -> the torch optimizer's keyword arguments
OPTIMIZER_IMPLS = {"fused": dict(fused=True), "foreach": dict(foreach=True), "for_loop": dict(foreach=False), "": {}}


# ----------------------------------------------------------------------------- validation and construction

def validate(cfg, last_iter):
    """Start-up checks of the keys this module reads; runtime.validate calls it with the run's last
    iteration (runtime.last_iter)."""
    err = configurator.ConfigError
    if cfg["optimizer"] not in OPTIMIZERS:
        raise err(f"optimizer={cfg['optimizer']!r}: use one of {OPTIMIZERS}")
    if cfg["optimizer_impl"] not in OPTIMIZER_IMPLS:
        raise err(f"optimizer_impl={cfg['optimizer_impl']!r}: use one of {tuple(OPTIMIZER_IMPLS)}")
    if cfg["optimizer"] == "sgd" and cfg["nesterov"] and cfg["momentum"] <= 0:
        raise err("nesterov=True needs momentum > 0: set momentum (e.g. 0.9) or nesterov=False")
    if cfg["optimizer"] == "adamw_spam":
        for key in ("spam_theta", "spam_spike_z"):
            if cfg[key] <= 0:
                raise err(f"{key} must be > 0, got {cfg[key]}")
        if cfg["spam_window"] < 2:
            raise err(f"spam_window must be >= 2 (a z-score needs a spread), got {cfg['spam_window']}")
        if cfg["spam_interval"] < 0 or cfg["spam_warmup"] < 0:
            raise err("spam_interval and spam_warmup must be >= 0 (spam_interval=0 disables the resets)")
        if cfg["spam_interval"] and cfg["spam_warmup"] > cfg["spam_interval"]:
            raise err(f"spam_warmup={cfg['spam_warmup']} exceeds spam_interval={cfg['spam_interval']}: the "
                      f"re-warm would still run at the next reset; shorten spam_warmup")
    if cfg["pruning"] not in PRUNINGS:
        raise err(f"pruning={cfg['pruning']!r}: use one of {PRUNINGS}")
    if cfg["pruning"] == "none":
        return
    if cfg.get("tp_size", 1) > 1:
        raise err("pruning needs whole weights for its global threshold, but tp_size > 1 shards them: "
                  "set pruning='none' or tp_size=1")
    if cfg["pruning"] == "state":
        if cfg["prune_score"] not in SCORES:
            raise err(f"prune_score={cfg['prune_score']!r}: use one of {tuple(SCORES)}")
        if cfg["prune_score"] in STATE_SCORES and cfg["optimizer"] == "sgd":
            raise err(f"prune_score={cfg['prune_score']!r} reads Adam's exp_avg/exp_avg_sq, which optimizer='sgd' "
                      f"does not keep: use an Adam optimizer or pruning='magnitude'")
    if not 0.0 <= cfg["target_sparsity"] < 1.0:
        raise err(f"target_sparsity must be in [0, 1), got {cfg['target_sparsity']}")
    if cfg["prune_ramp"] not in PRUNE_RAMPS:
        raise err(f"prune_ramp={cfg['prune_ramp']!r}: use one of {PRUNE_RAMPS}")
    if cfg["prune_threshold"] not in PRUNE_THRESHOLDS:
        raise err(f"prune_threshold={cfg['prune_threshold']!r}: use one of {PRUNE_THRESHOLDS}")
    if cfg["prune_interval"] < 1 or cfg["prune_start"] < 0 or cfg["prune_sample"] < 1:
        raise err("prune_interval and prune_sample must be >= 1 and prune_start >= 0")
    if ramp_end(cfg, last_iter) <= cfg["prune_start"]:
        raise err(f"the sparsity ramp ends at {ramp_end(cfg, last_iter)} (prune_ramp_end, 0 = the run's "
                  f"iterations), not after prune_start={cfg['prune_start']}: lower prune_start or raise prune_ramp_end")


def ramp_end(cfg, last_iter):
    """Where the sparsity reaches its target: prune_ramp_end, else the run's last iteration."""
    return cfg["prune_ramp_end"] or last_iter


def build_optimizer(model, cfg):
    """The optimizer named by cfg['optimizer'], always over model.param_groups (no decay on
    biases and norms)."""
    betas = (cfg["beta1"], cfg["beta2"])
    if cfg["optimizer"] == "adamw_spam":
        return AdamWSPAM(model.param_groups(cfg["weight_decay"]), lr=cfg["learning_rate"], betas=betas,
                         theta=cfg["spam_theta"], spike_z=cfg["spam_spike_z"], window=cfg["spam_window"],
                         reset_interval=cfg["spam_interval"], rewarm=cfg["spam_warmup"])
    return model.configure_optimizers(cfg["optimizer"], cfg["learning_rate"], cfg["weight_decay"], betas,
                                      cfg["momentum"], cfg["nesterov"], impl=cfg["optimizer_impl"])


def torch_optimizer(groups, optimizer, learning_rate, betas, momentum, nesterov, impl):
    """One of torch's own optimizers over param groups (GPT.configure_optimizers)."""
    impl = OPTIMIZER_IMPLS[impl]
    if optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, **impl)
    if optimizer == "adam":
        # Adam's weight_decay is the classic L2 term added to the gradient (coupled), which is
        # exactly what separates it from AdamW in an optimizer comparison.
        return torch.optim.Adam(groups, lr=learning_rate, betas=betas, **impl)
    if optimizer == "sgd":
        return torch.optim.SGD(groups, lr=learning_rate, momentum=momentum, nesterov=nesterov, **impl)
    raise ValueError(f"optimizer={optimizer!r}: use one of 'adamw', 'adam', 'sgd'")


def step_kwargs(optimizer, grad_norm):
    """AdamW-SPAM detects spikes on the gradient norm before clipping; others take nothing."""
    return {"grad_norm": grad_norm} if isinstance(optimizer, AdamWSPAM) else {}


# ----------------------------------------------------------------------------- AdamW-SPAM

class AdamWSPAM(torch.optim.Optimizer):
    """AdamW (AMSGrad) with SPAM's spike handling (Huang et al. 2025, "SPAM: Spike-Aware Adam with
    Momentum Reset"), as the pruning / MLA study ran it:

    - element clipping: a gradient entry with g^2 > theta * v_hat (v_hat the bias-corrected second
      moment before this step) is clipped to sign(g) * sqrt(theta * v_hat). Bias correction matters:
      right after a reset v holds one step's (1 - beta2) g^2, and the raw v would clip everything.
      Entries with no gradient history yet (v == 0) are not clipped.
    - spike detection: when the global gradient norm's z-score against the last `window` norms
      exceeds `spike_z`, m *= 0.5 and v *= 0.9 before the update.
    - every `reset_interval` steps m, v and the AMSGrad maximum are zeroed and bias correction
      restarts; the learning rate then re-warms with a cosine over `rewarm` steps (`lr_scale`),
      multiplying whatever schedule train.py sets in group['lr'].

    The norm history and the step clock are part of state_dict(), so resume is exact.

    No step reads the device: the norm history (float64, as Python's floats were), the spike test and
    the spike and clipping counts stay on it, and `spam` reads them when asked (a log's metrics, a
    checkpoint). A spike scales m and v by a factor of 1 when there is none, bit for bit the same.
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=EPS, weight_decay=0.0, theta=50.0,
                 spike_z=2.0, window=100, reset_interval=1000, rewarm=1000):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.theta, self.spike_z, self.window = theta, spike_z, window
        self.reset_interval, self.rewarm = reset_interval, rewarm
        self.spam = dict(total_step=0, norms=[], spikes=0, resets=0, clipped=0)

    @property
    def spam(self):
        """{total_step, norms, spikes, resets, clipped}: the host's dict, brought up to date with what
        the steps since the last read left on the device (a wait for the device, when there are such)."""
        if self._unread is not None:
            history, spikes, clipped = self._unread
            self._spam.update(norms=history.tolist(), spikes=self._spam["spikes"] + int(spikes),
                              clipped=self._spam["clipped"] + int(clipped))
            self._unread = None
        return self._spam

    @spam.setter
    def spam(self, value):
        self._spam, self._unread, self._history = value, None, None  # history: rebuilt from value["norms"]

    def lr_scale(self, step=None):
        """The re-warm multiplier for optimizer step `step` (1-based; default: the next one): a
        cosine from ~0 to 1 over the `rewarm` steps that start at each reset."""
        step = self._spam["total_step"] + 1 if step is None else step  # the host's count: no device read
        if not self.reset_interval or step <= self.reset_interval:
            return 1.0
        since = (step - 1) % self.reset_interval  # 0 at a reset step
        if since >= self.rewarm:
            return 1.0
        return 0.5 * (1.0 - math.cos(math.pi * (since + 1) / self.rewarm))

    def is_spike(self, history, norm):
        """Whether `norm`'s z-score against the `history` (float64 tensors on the device) exceeds spike_z:
        a bool tensor, None (no spike) under two norms (a z-score needs a spread)."""
        if len(history) < 2:
            return None
        mean = history.sum() / len(history)
        std = ((history - mean) ** 2).sum().div(len(history) - 1).sqrt()
        return (std > 0) & ((norm - mean) / std > self.spike_z)

    @torch.no_grad()
    def step(self, closure=None, grad_norm=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        grads = [p.grad for group in self.param_groups for p in group["params"] if p.grad is not None]
        if grad_norm is None:
            grad_norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads]))
        device = grads[0].device if grads else torch.device("cpu")
        norm = torch.as_tensor(grad_norm, device=device).detach().to(torch.float64).reshape(())
        if self._history is None:  # the first step, or after load_state_dict
            self._history = torch.tensor(self._spam["norms"], dtype=torch.float64, device=device)
        spike = self.is_spike(self._history, norm)
        self._history = torch.cat([self._history, norm[None]])[-self.window:]
        spam = self._spam  # the host's counters; the device's wait in `_unread`
        spam["total_step"] += 1
        step = spam["total_step"]
        # Reset after every reset_interval completed steps: before steps interval+1, 2*interval+1, ...
        reset = self.reset_interval > 0 and step > 1 and (step - 1) % self.reset_interval == 0
        spam["resets"] += reset
        scale = self.lr_scale(step)
        clipped = torch.zeros((), dtype=torch.int64, device=device)
        if spike is not None:  # m *= 0.5 and v *= 0.9 on a spike, else * 1 (exact)
            m_factor = torch.where(spike, 0.5, 1.0).float()
            v_factor = torch.where(spike, 0.9, 1.0).float()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            lr = group["lr"] * scale
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state or reset:
                    state["step"] = 0
                    for key in ADAM_STATES:
                        state[key] = torch.zeros_like(p, memory_format=torch.preserve_format)
                m, v, v_max = (state[k] for k in ADAM_STATES)
                g = p.grad
                if state["step"] > 0:
                    limit = (v * (self.theta / (1 - beta2 ** state["step"]))).sqrt()
                    # v == 0: no gradient seen yet (an embedding row of a token not met so far); a
                    # limit of 0 would freeze that entry forever.
                    over = (g.abs() > limit) & (v > 0)
                    clipped += over.sum()
                    g = torch.where(over, g.sign() * limit, g)
                if spike is not None:
                    m.mul_(m_factor)
                    v.mul_(v_factor)
                state["step"] += 1
                p.mul_(1 - lr * group["weight_decay"])
                m.mul_(beta1).add_(g, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                torch.maximum(v_max, v, out=v_max)
                denom = (v_max / (1 - beta2 ** state["step"])).sqrt_().add_(group["eps"])
                p.addcdiv_(m, denom, value=-lr / (1 - beta1 ** state["step"]))
        spikes = spike.long() if spike is not None else torch.zeros((), dtype=torch.int64, device=device)
        if self._unread is not None:
            spikes, clipped = spikes + self._unread[1], clipped + self._unread[2]
        self._unread = (self._history, spikes, clipped)
        return loss

    def metrics(self):
        return {"spam_spikes": self.spam["spikes"], "spam_resets": self.spam["resets"],
                "spam_clipped": self.spam["clipped"], "spam_lr_scale": self.lr_scale()}

    def state_dict(self):
        state = super().state_dict()
        state["spam"] = {k: (list(v) if isinstance(v, list) else v) for k, v in self.spam.items()}
        return state

    def load_state_dict(self, state_dict):
        state_dict = dict(state_dict)
        if "spam" not in state_dict:
            raise configurator.ConfigError("the checkpoint's optimizer state is not AdamW-SPAM's: resume with "
                                           "the run's own optimizer")
        self.spam = {k: (list(v) if isinstance(v, list) else v) for k, v in state_dict.pop("spam").items()}
        super().load_state_dict(state_dict)


def optimizer_metrics(optimizer):
    return optimizer.metrics() if isinstance(optimizer, AdamWSPAM) else {}


# ----------------------------------------------------------------------------- pruning scores
# w the weight, m = exp_avg, v = exp_avg_sq (zeros where the optimizer keeps no state). Higher
# scores are kept; the lowest are pruned. Formulas: docs/experiments.md.

def score_magnitude(w, m, v):
    return w.abs()


def score_bitter0(w, m, v):
    return (w * m).abs() * w.abs() / (v.sqrt() + EPS)


def score_bitter3(w, m, v):
    return w.abs() * (m.abs() + EPS).sqrt()


def score_bitter5(w, m, v):
    movement = -w.sign() * m / (v.sqrt() + EPS)  # > 0: Adam is pushing w toward zero
    return -movement + 0.1 * w.abs()


def score_bitter6(w, m, v):
    return score_bitter3(w, m, v) * (m * m / (v + EPS)).sqrt()


def score_bitter7(w, m, v):
    return w.abs() * (v.abs() + EPS) ** 0.25


SCORES = {
    "magnitude": score_magnitude,
    "bitter0": score_bitter0,
    "bitter1": score_magnitude,  # pure magnitude
    "bitter2": score_magnitude,  # bitter1's score; the variant is its longer budget (config max_iters)
    "bitter3": score_bitter3,
    "bitter4": score_bitter3,  # bitter3's score with layer-dependent sparsity (Pruner.layer_scale)
    "bitter5": score_bitter5,
    "bitter6": score_bitter6,
    "bitter7": score_bitter7,
}
STATE_SCORES = ("bitter0", "bitter3", "bitter4", "bitter5", "bitter6", "bitter7")
LAYERWISE_SCORES = ("bitter4",)


def sparsity_at(step, target, start, end, ramp):
    """s(t) = target * p^3 (cubic) or target * p (linear), p = (t - start) / (end - start) in [0, 1]."""
    if step < start:
        return 0.0
    p = min(1.0, (step - start) / (end - start))
    return target * (p ** 3 if ramp == "cubic" else p)


def prune_count(scores, k):
    """A boolean mask (True = keep) that prunes exactly the k lowest scores (ties by position)."""
    keep = torch.ones_like(scores, dtype=torch.bool)
    if k <= 0:
        return keep
    threshold = torch.kthvalue(scores, k).values
    below = scores < threshold
    ties = (scores == threshold).nonzero().flatten()[: k - int(below.sum())]
    keep[below] = False
    keep[ties] = False
    return keep


def prune_sampled(scores, keep, k, sample, generator):
    """Approximate: prune the scores below a quantile estimated from `sample` random kept scores,
    for models whose concatenated scores are too many for an exact k-th value."""
    n_kept, more = int(keep.sum()), k - int((~keep).sum())
    if more <= 0 or n_kept == 0:
        return keep
    kept = scores[keep]
    idx = torch.randint(0, n_kept, (min(sample, n_kept),), generator=generator).to(scores.device)
    threshold = torch.quantile(kept[idx].float(), min(1.0, more / n_kept))
    return keep & (scores > threshold)


# ----------------------------------------------------------------------------- the pruner

class Pruner:
    """Masks on Linear weights, one global threshold (bitter4: one per layer), monotone: a pruned
    weight stays pruned. Masked weights, their gradients and their optimizer states are zero.

    The tied token embedding / lm_head matrix is never pruned: with tie_weights it is wte.weight,
    and pruning it would delete vocabulary embeddings, not just output connections. An untied
    lm_head is a plain Linear and is pruned like the others.
    """

    def __init__(self, model, optimizer, cfg, last_iter):
        self.optimizer = optimizer
        self.method, self.score_name = cfg["pruning"], cfg["prune_score"]
        self.score = SCORES["magnitude" if self.method == "magnitude" else self.score_name]
        self.target, self.start, self.end = cfg["target_sparsity"], cfg["prune_start"], ramp_end(cfg, last_iter)
        self.interval, self.ramp = cfg["prune_interval"], cfg["prune_ramp"]
        self.sampled, self.sample = cfg["prune_threshold"] == "sampled", cfg["prune_sample"]
        self.generator = torch.Generator().manual_seed(cfg["seed"])
        self.params, self.layers, self.excluded = prunable(model)
        self.n_blocks = len(model.transformer.h)
        self.masks = {name: torch.ones_like(p, dtype=torch.bool) for name, p in self.params.items()}
        self.current = 0.0  # the scheduled sparsity of the latest mask update

    def describe(self):
        n = sum(p.numel() for p in self.params.values())
        score = "magnitude |w|" if self.method == "magnitude" else self.score_name
        text = (f"pruning {len(self.params)} Linear weights ({n:,} parameters) by {score} to {self.target:.0%} "
                f"sparsity, {self.ramp} ramp from step {self.start} to {self.end}, masks every {self.interval} "
                f"steps, {'sampled' if self.sampled else 'exact'} threshold")
        if self.excluded:
            text += f"; not pruned: {', '.join(self.excluded)}"
        return text

    def is_update_step(self, step):
        return self.start <= step <= self.end and ((step - self.start) % self.interval == 0 or step == self.end)

    @torch.no_grad()
    def mask_grads(self):
        if not self.current:
            return  # nothing is pruned yet
        for name, p in self.params.items():
            if p.grad is not None:
                p.grad.mul_(self.masks[name])

    @torch.no_grad()
    def step(self, step):
        """After optimizer step number `step` (1-based): recompute masks on the schedule, and
        (re-)apply them to weights and optimizer states."""
        if self.is_update_step(step):
            self.current = sparsity_at(step, self.target, self.start, self.end, self.ramp)
            self.update_masks(self.current)
            self.apply(states=True)
        elif self.current:
            self.apply(states=False)

    def apply(self, states):
        for name, p in self.params.items():
            p.mul_(self.masks[name])
            if states:
                for buf in self.optimizer.state.get(p, {}).values():
                    if torch.is_tensor(buf) and buf.shape == p.shape:
                        buf.mul_(self.masks[name])

    def scores(self, name, p):
        state = self.optimizer.state.get(p, {})
        zeros = torch.zeros_like(p)
        score = self.score(p.float(), state.get("exp_avg", zeros).float(), state.get("exp_avg_sq", zeros).float())
        # Already-pruned weights rank below everything: masks only grow, so pruned weights stay zero.
        return score.masked_fill(~self.masks[name], float("-inf"))

    def update_masks(self, sparsity):
        if self.score_name in LAYERWISE_SCORES and self.method == "state":
            for layer, names in self.layer_groups().items():
                self.prune(names, min(0.95, sparsity * self.layer_scale(layer)))
        else:
            self.prune(list(self.params), sparsity)

    def prune(self, names, sparsity):
        flat = torch.cat([self.scores(n, self.params[n]).flatten() for n in names])
        if self.sampled:
            keep = prune_sampled(flat, torch.cat([self.masks[n].flatten() for n in names]),
                                 round(sparsity * flat.numel()), self.sample, self.generator)
        else:
            keep = prune_count(flat, round(sparsity * flat.numel()))
        for n in names:
            size = self.masks[n].numel()
            self.masks[n] = keep[:size].view_as(self.masks[n])
            keep = keep[size:]

    def layer_groups(self):
        groups = {}
        for name in self.params:
            groups.setdefault(self.layers[name], []).append(name)
        return groups

    def layer_scale(self, layer):
        """bitter4: 0.7x the sparsity in the first block up to 1.3x in the last."""
        return 0.7 + 0.6 * min(1.0, layer / max(1, self.n_blocks - 1))

    def metrics(self):
        total = sum(m.numel() for m in self.masks.values())
        pruned = sum(int((~m).sum()) for m in self.masks.values())
        out = {"sparsity": pruned / total, "sparsity_target": self.current}
        for layer, names in sorted(self.layer_groups().items()):
            n = sum(self.masks[k].numel() for k in names)
            key = "sparsity_head" if layer == self.n_blocks else f"sparsity_layer{layer}"  # an untied lm_head
            out[key] = sum(int((~self.masks[k]).sum()) for k in names) / n
        return out

    def state_dict(self):
        return {"masks": {k: v.cpu() for k, v in self.masks.items()}, "current": self.current,
                "generator": self.generator.get_state()}

    def load_state_dict(self, state):
        if set(state["masks"]) != set(self.masks):
            raise configurator.ConfigError("the checkpoint's pruning masks cover different weights than this model: "
                                           "resume with the run's own config")
        self.masks = {k: v.to(self.params[k].device) for k, v in state["masks"].items()}
        self.current = state["current"]
        self.generator.set_state(state["generator"])


def prunable(model):
    """{name: weight} of every Linear except a head tied to the embedding, {name: block index}
    (blocks after the last one for anything outside transformer.h), and the excluded names."""
    params, layers, excluded = {}, {}, []
    embedding = model.transformer.wte.weight
    n_blocks = len(model.transformer.h)
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        if module.weight is embedding:
            excluded.append(f"{name}.weight (tied to transformer.wte.weight)")
            continue
        params[f"{name}.weight"] = module.weight
        block = re.search(r"(?:^|\.)h\.(\d+)\.", name)
        layers[f"{name}.weight"] = int(block.group(1)) if block else n_blocks
    return params, layers, excluded


def weights_bytes(model):
    """Memory of the model's parameters, shared (tied) tensors counted once."""
    seen = {p.data_ptr(): p.numel() * p.element_size() for p in model.parameters()}
    return sum(seen.values())
