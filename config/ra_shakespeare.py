# Overlay: any recipe of the RA ablation given before it (train_ra_*.py, train_mla.py,
# train_ra_mla.py, train_gated_attn.py) as its CPU twin; suites/ra_shakespeare.py runs the five
# RA variants x 3 paired seeds this way.
# python data/shakespeare/prepare.py --tokenizer=char && python train.py config/train_ra_late.py config/ra_shakespeare.py
# Why these settings:
# - Characters, not GPT-2 tokens: with GPT-2's 50k vocabulary the head would hold most parameters
#   and FLOPs, so a twin would measure its head more than its attention.
# - 96 wide, 2,048 tokens per step for 500 steps (~0.2 epochs), cosine decay to a tenth: late enough
#   that the loss has slowed and the seed moves it little (baseline sd 0.016 over seeds 1-3).
# - 20 evaluation batches (41k characters, the same windows in every run).
# - float32: the same numbers on CPUs with and without bf16 (emulated bf16 is ~400x slower).
# - MLA latent 24 = n_embd / 4 (the GPT-2 configs use 128 of 768).
import os

exec(open(os.path.join(os.path.dirname(__file__), "train_shakespeare.py")).read())
out_dir = "out-ra-shakespeare"
model_type = "ra"
dataset = "shakespeare_char"
vocab_size = 128  # the plays use 80 characters
sample_tokens = 0
batch_size = 16
block_size = 128
gradient_accumulation_steps = 1
n_embd = 96
# The rate tools/tune_lr.py found best (reports/tune_ra_shakespeare: 4x the 3e-3 the twin had before), written here.
learning_rate = 0.012
min_lr = 0.0012
warmup_iters = 40
max_iters = 500
eval_interval = 100
eval_iters = 20
dtype = "float32"
mla_latent_dim = 24
# The GPU recipes' logging and compile settings, back to the plain CPU run's.
wandb_log = False
wandb_project = "gpt2-ablations"
wandb_run_name = ""
compile = False
lr_tuning = 'tuned by tools/tune_lr.py on 2026-11-28 at commit 24b62bb02e: baseline from scratch on 4 rates 0.003..0.024 (x2), seeds 901, 902, best 0.012 (bracketed)'
