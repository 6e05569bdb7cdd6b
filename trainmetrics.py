"""What a training step measures, read from the device only when needed: StepMetrics.

The host queues step after step while the GPU still runs the earlier ones; a step's loss, gradient
norm and timer lap stay on the device until a log line, an evaluation or a checkpoint next, the end
of the budget (max_time is checked there) or a signal to a lone process needs them, and are then
read in one go (read_steps). The values are the ones a read after every step would give, bit for
bit. A non-finite loss read there stops the run (TrainingDiverged).
"""
import dataclasses
import math

import torch

import devices
import messages
import runrecord


class TrainingDiverged(RuntimeError):
    """A loss (or, without a loss scaler, a gradient norm) became non-finite at iteration iter_num:
    `fields` are the values, the log's diverged event."""

    def __init__(self, iter_num, **fields):
        self.iter_num, self.fields = iter_num, fields
        super().__init__(f"{messages.what_diverged(fields)} at iteration {iter_num}")


def budget_reached(cfg, position):
    """'max_iters', 'max_tokens' or 'max_time' where that budget is spent, else None."""
    if position.iter_num >= cfg["max_iters"]:
        return "max_iters"
    if cfg["max_tokens"] and position.tokens_seen >= cfg["max_tokens"]:
        return "max_tokens"
    if cfg["max_time"] and position.train_time >= cfg["max_time"]:
        return "max_time"
    return None


def read_steps(unread, timer, layout, signalled):
    """[(loss, grad norm, seconds)] of the steps the host has queued since the last read, and whether a
    stop signal reached any rank: one wait for the device and one all-reduce, which gives every rank the
    same losses and the same clock, so all ranks agree on when to stop (a disagreement would hang the
    next collective). The values are the ones each step would have read at once, bit for bit."""
    seconds = [timer.seconds(lap) for _, _, lap in unread]  # waits for the last step's last kernel
    losses = torch.stack([loss for loss, _, _ in unread])
    shared = torch.cat([losses, torch.tensor(seconds + [float(signalled)], device=losses.device)])
    shared = layout.all_reduce(shared, mean=True).tolist()
    grad_norms = torch.stack([grad_norm for _, grad_norm, _ in unread]).tolist()  # equal on every rank
    n = len(unread)
    return list(zip(shared[:n], grad_norms, shared[n:2 * n])), shared[-1] > 0


@dataclasses.dataclass
class Window:
    """The training steps since the last log line."""
    time: float = 0.0
    iters: int = 0
    peak_mib: float = 0.0


class StepMetrics:
    """Times each step, keeps its loss and gradient norm on the device until they are needed, checks
    them, adds the steps' seconds to the run's training time and writes the train log line."""

    def __init__(self, cfg, layout, raw_model, act_norms, log, dtype, peak_flops, scaler):
        self.cfg, self.layout, self.raw_model, self.act_norms, self.log = cfg, layout, raw_model, act_norms, log
        self.dtype, self.peak_flops, self.scaler = dtype, peak_flops, scaler
        self.timer = devices.DeviceTimer(layout.device)
        self.unread = []  # the steps queued since the host last read the device: (loss, grad norm, timer lap)
        self.window = Window()
        self.step_peak_since_eval = None  # MiB: the memory_ratio's numerator (a training step's, not evaluation's)
        self.lr = None

    def start_step(self):
        devices.reset_peak_memory(self.layout.device)  # evaluation's peak (a batch's whole logits) is logged apart
        self.timer.start()

    def end_step(self, loss, grad_norm, lr, position, signals):
        """Queue the step's values (still on the device), move `position` one step on, and read the
        device where something needs the numbers. Returns the stop reason, or None to go on."""
        self.unread.append((loss, grad_norm, self.timer.stop()))
        self.lr = lr
        step_peak = devices.peak_memory_mib(self.layout.device)  # the allocator's books, kept on the host
        self.window.peak_mib = max(self.window.peak_mib, step_peak)
        self.step_peak_since_eval = max(self.step_peak_since_eval or 0.0, step_peak)
        position.iter_num += 1
        position.tokens_seen += self.cfg["tokens_per_iter"]
        signalled = self.read(position, signals) if self.read_due(position, signals) else False
        return budget_reached(self.cfg, position) or ("signal" if signalled else None)

    def read_due(self, position, signals):
        """A log line, an evaluation or checkpoint next, the end of the budget, a signal to a lone process."""
        cfg, it = self.cfg, position.iter_num
        return (it % cfg["log_interval"] == 0 or it % cfg["eval_interval"] == 0 or it in cfg["eval_at"]
                or budget_reached(cfg, position) is not None or (signals.received and not self.layout.distributed))

    def read(self, position, signals):
        """Read the queued steps, check them, log at log steps; returns whether any rank was signalled."""
        steps, signalled = read_steps(self.unread, self.timer, self.layout, signals.received is not None)
        self.unread = []
        for it, (loss, grad_norm, seconds) in enumerate(steps, start=position.iter_num - len(steps) + 1):
            position.train_time += seconds
            self.window.time += seconds
            self.window.iters += 1
            if not math.isfinite(loss) or (not math.isfinite(grad_norm) and not self.scaler.is_enabled()):
                raise TrainingDiverged(it, loss=loss, grad_norm=grad_norm)
        if position.iter_num % self.cfg["log_interval"] == 0:
            self.log_train(position, loss, grad_norm)
        return signalled

    def log_train(self, position, loss, grad_norm):
        step_time = self.window.time / self.window.iters
        tokens_per_iter = self.cfg["tokens_per_iter"]
        tokens_per_sec = tokens_per_iter / step_time
        mfu, self.peak_flops = devices.model_flops_utilization(
            self.raw_model, tokens_per_sec / self.layout.world_size, self.layout.device, self.dtype, self.peak_flops)
        record = dict(iter=position.iter_num, tokens=position.tokens_seen, loss=loss, lr=self.lr, grad_norm=grad_norm,
                      **self.act_norms.read(), step_time_ms=1000 * step_time, tokens_per_sec=tokens_per_sec,
                      mfu=mfu, mfu_peak_gflops=self.peak_flops / 1e9 if self.peak_flops else None,
                      peak_memory_mib=self.window.peak_mib, tokens_per_iter=tokens_per_iter,
                      load_average=runrecord.load_average())
        self.log.event("train", messages.train_line(record), **record)
        self.window = Window()

    def take_step_peak(self):
        """The highest training step's peak memory (MiB) since the last call (None before any step)."""
        peak, self.step_peak_since_eval = self.step_peak_since_eval, None
        return peak
