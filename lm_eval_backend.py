"""The workbench's checkpoints as an lm-evaluation-harness model ("workbench"): every model type
(GPT, RA, MLA, gated attention, reduced-sync) on our own model classes, on the CPU or a GPU, under the
run's dtype. lm_eval_run.py puts it on lm-eval's command line; ablation/lm_eval_results.py reads what it wrote.

Scoring follows evaluation.py: a continuation's log-likelihood is the sum over its tokens of
logit - logsumexp(logits) over the model's whole vocabulary (padding rows included, as eval.py's
loss and hellaswag.py's scores), in float64 with an order-free logsumexp. Requests are batched
longest first, padded on the right (causal attention never looks at the padding); a row longer than
block_size keeps its last block_size + 1 tokens, as lm-eval's `hf` backend does. Rolling
log-likelihoods use lm-eval's own windows (every token predicted once, each window with the longest
context). Generation is greedy, over GPT-2's 50,257 tokens only (a padding id has no text), and
batches the prompts of equal length (learned positions: padding on the left would move them).

lm-eval is an optional install (requirements-dev.txt); nothing else in the workbench imports this.
"""
import json
import math
import os

import lm_eval.models  # noqa: F401  lm-eval's own backends: get_model imports them only into an empty registry
import torch
from lm_eval import utils as lm_utils
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model

import parallel
import runrecord
import tokendata
from configurator import ConfigError
from evaluation import PAD_ID, order_free_logsumexp
from runtime import load_model
from devices import check_dtype, precision

MODEL_NAME = "workbench"


def run_dtype(out_dir):
    """The dtype the run trained under ('' when the run chose automatically or left no config.json)."""
    path = os.path.join(out_dir, "config.json")
    if not os.path.exists(path):
        return ""
    with open(path) as f:
        return json.load(f).get("dtype", "")


@register_model(MODEL_NAME)
class WorkbenchLM(TemplateLM):
    """lm-eval's LM over a run directory's ckpt.pt (init_from='resume') or a local HF GPT-2 directory."""

    def __init__(self, out_dir="", init_from="resume", device="", dtype="", batch_size=8, max_gen_toks=256,
                 max_batch_size=None):
        super().__init__()
        if init_from == "resume" and not out_dir:
            raise ConfigError("model_args needs out_dir=RUN_DIR (or init_from=HF_GPT2_DIR)")
        if not str(batch_size).isdigit() or int(batch_size) < 1:
            raise ConfigError(f"batch_size={batch_size!r}: pass a positive integer (rows per forward pass)")
        if init_from == "resume":
            runrecord.check_gpt2_tokens(out_dir, "lm-eval")
        self._device = parallel.pick_device(device)
        dtype = dtype or (run_dtype(out_dir) if init_from == "resume" else "")
        check_dtype(dtype, self._device)
        self.dtype, self.autocast = precision(dtype, self._device)
        self.model = load_model(dict(out_dir=out_dir, init_from=init_from), self._device).eval()
        if self.model.config.vocab_size < tokendata.GPT2_VOCAB_SIZE:
            raise ConfigError(f"the model's vocab_size={self.model.config.vocab_size} is smaller than GPT-2's "
                              f"{tokendata.GPT2_VOCAB_SIZE}: lm-eval feeds GPT-2 BPE tokens, so only GPT-2-tokenized runs "
                              f"can be evaluated")
        self.batch_size = int(batch_size)
        self.max_gen_toks = int(max_gen_toks)
        self.encoding = tokendata.gpt2_encoding()

    @classmethod
    def create_from_arg_obj(cls, arg_dict, additional_config=None):
        """model_args win over the command line's --device and --batch_size (lm-eval passes both)."""
        extra = {k: v for k, v in (additional_config or {}).items() if v is not None and k not in arg_dict}
        return cls(**arg_dict, **extra)

    @classmethod
    def create_from_arg_string(cls, arg_string, additional_config=None):
        return cls.create_from_arg_obj(lm_utils.simple_parse_args_string(arg_string), additional_config)

    # ------------------------------------------------------------------ tokens

    @property
    def eot_token_id(self):
        return tokendata.EOT_TOKEN

    @property
    def max_length(self):
        return self.model.config.block_size

    @property
    def tokenizer_name(self):
        return "gpt2"

    def tok_encode(self, string, add_special_tokens=None, **kwargs):
        return self.encoding.encode(string, allowed_special="all")

    def tok_decode(self, ids):
        return self.encoding.decode([t for t in ids if t < tokendata.GPT2_VOCAB_SIZE])

    # ------------------------------------------------------------------ scoring

    @torch.no_grad()
    def score(self, pairs):
        """(log-likelihood, is_greedy) of each (context ids, continuation ids), in one forward pass."""
        rows = [(context + continuation)[-(self.max_length + 1):] for context, continuation in pairs]
        n_scored = [min(len(continuation), len(ids) - 1) for (_, continuation), ids in zip(pairs, rows)]
        T = max(len(ids) for ids in rows) - 1
        tokens = torch.full((len(rows), T + 1), PAD_ID, dtype=torch.long)
        for r, ids in enumerate(rows):
            tokens[r, :len(ids)] = torch.tensor(ids)
        with self.autocast:
            logits, _ = self.model(tokens[:, :-1].to(self._device))
        row = torch.cat([torch.full((n,), r) for r, n in enumerate(n_scored)])
        position = torch.cat([torch.arange(len(ids) - 1 - n, len(ids) - 1) for ids, n in zip(rows, n_scored)])
        scored = logits[row.to(self._device), position.to(self._device)].float()  # (tokens, vocab)
        target = tokens[row, position + 1].to(self._device)
        log_probs = (scored.gather(1, target[:, None])[:, 0].double() - order_free_logsumexp(scored)).cpu()
        greedy = (scored.argmax(1) == target).cpu()
        # math.fsum rounds the exact sum once: the same token scores give the same total in any batch
        return [(math.fsum(log_probs[row == r].tolist()), bool(greedy[row == r].all())) for r in range(len(rows))]

    def score_batched(self, pairs):
        """score() over many pairs, batch_size rows at a time, longest first; results in input order."""
        order = sorted(range(len(pairs)), key=lambda i: -len(pairs[i][0] + pairs[i][1]))
        results = [None] * len(pairs)
        for start in range(0, len(order), self.batch_size):
            batch = order[start:start + self.batch_size]
            for i, result in zip(batch, self.score([pairs[i] for i in batch])):
                results[i] = result
        return results

    def _loglikelihood_tokens(self, requests, disable_tqdm=False, **kwargs):
        results = self.score_batched([(context, continuation) for _, context, continuation in requests])
        for (strings, _, _), result in zip(requests, results):
            self.cache_hook.add_partial("loglikelihood", strings, result)
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm=False):
        """Each text's total log-likelihood, every token predicted once (lm-eval's rolling windows)."""
        windows, owner = [], []
        for i, (text,) in enumerate(req.args for req in requests):
            for window in lm_utils.get_rolling_token_windows(token_list=self.tok_encode(text),
                                                             prefix_token=self.prefix_token_id,
                                                             max_seq_len=self.max_length, context_len=1):
                windows.append(lm_utils.make_disjoint_window(window))
                owner.append(i)
        scores = self.score_batched(windows)
        totals = [math.fsum(s for (s, _), o in zip(scores, owner) if o == i) for i in range(len(requests))]
        for req, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals

    # ------------------------------------------------------------------ generation

    def generate_until(self, requests, disable_tqdm=False):
        """Greedy continuations, each cut before the first of its stop strings (and at end-of-text)."""
        prompts = [self.tok_encode(context) for context, _ in (req.args for req in requests)]
        settings = [self.generation_settings(gen_kwargs) for _, gen_kwargs in (req.args for req in requests)]
        order = sorted(range(len(requests)), key=lambda i: (len(prompts[i]), settings[i][1]))
        results = [None] * len(requests)
        start = 0
        while start < len(order):
            first = order[start]
            same = [i for i in order[start:start + self.batch_size]
                    if len(prompts[i]) == len(prompts[first]) and settings[i][1] == settings[first][1]]
            texts = self.greedy([prompts[i] for i in same], [settings[i][0] for i in same], settings[first][1])
            for i, text in zip(same, texts):
                results[i] = text
                self.cache_hook.add_partial("generate_until", requests[i].args, text)
            start += len(same)
        return results

    def generation_settings(self, gen_kwargs):
        """(stop strings, max new tokens) of one request; sampling is refused (greedy only)."""
        gen_kwargs = dict(gen_kwargs)
        if gen_kwargs.pop("do_sample", False) or gen_kwargs.pop("temperature", 0.0):
            raise ValueError(f"{MODEL_NAME} generates greedily only: the task asks for sampling ({gen_kwargs})")
        until = gen_kwargs.pop("until", None) or []
        until = [until] if isinstance(until, str) else list(until)
        return until + [self.tok_decode([self.eot_token_id])], int(gen_kwargs.pop("max_gen_toks", self.max_gen_toks))

    @torch.no_grad()
    def greedy(self, prompts, stops, max_new_tokens):
        """Greedy continuations of equal-length prompts, each cut before its first stop string."""
        idx = torch.tensor(prompts, dtype=torch.long, device=self._device).view(len(prompts), -1)
        start = idx.size(1)
        texts = [""] * len(prompts)
        for _ in range(max_new_tokens):
            with self.autocast:
                logits, _ = self.model(idx[:, -self.max_length:], last_only=True)
            logits = logits[:, -1, :tokendata.GPT2_VOCAB_SIZE]  # only ids that have text
            idx = torch.cat([idx, logits.argmax(-1, keepdim=True)], dim=1)
            texts = [self.tok_decode(row[start:]) for row in idx.tolist()]
            if all(any(s in text for s in stop) for text, stop in zip(texts, stops)):
                break
        return [cut_at_stops(text, stop) for text, stop in zip(texts, stops)]


def cut_at_stops(text, stops):
    cut = min((text.index(s) for s in stops if s and s in text), default=len(text))
    return text[:cut]
