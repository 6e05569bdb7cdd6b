# Overlay: the CPU twin of any RA-family config given before it (train_ra_*.py, train_mla.py,
# train_ra_mla.py, train_gated_attn.py): the same variant keys on a small character-level model.
# python data/shakespeare/prepare.py --tokenizer=char
# python train.py config/train_ra_late.py config/ra_shakespeare.py --out_dir=out-ra-late-shakespeare
# python sweep.py suites/ra_shakespeare.py   (the whole ablation: suites/ra.py with this overlay)
# Why these settings:
# - Characters, not GPT-2 tokens: with GPT-2's 50k vocabulary the head holds 6.4M of 7.2M
#   parameters and most of the FLOPs, so the twin would measure its head more than its attention.
#   Here the blocks hold nearly all of the 0.46M parameters and the compute.
# - 96 wide, 2,048 tokens per step for 500 steps (1M characters, ~0.2 epochs), cosine to a tenth:
#   long enough that the loss has flattened, so the seed moves the baseline by sd 0.016
#   (docs/ra.md has the measurements), and cheap enough (~3.3 MFLOP per token) for 15 runs on 2 cores.
# - 20 evaluation batches (41k characters, the same windows in every run).
# - float32: the same numbers on CPUs with and without bf16 (emulated bf16 is ~400x slower).
# - MLA latent 24 = n_embd / 4 (the GPT-2 configs use 128 of 768).
import os

exec(open(os.path.join(os.path.dirname(__file__), "train_shakespeare.py")).read())
out_dir = "out-ra-shakespeare"  # one per variant: pass --out_dir
model_type = "ra"
dataset = "shakespeare_char"
vocab_size = 128  # the plays use 80 characters
sample_tokens = 0
batch_size = 16
block_size = 128
gradient_accumulation_steps = 1
n_embd = 96
learning_rate = 3e-3
min_lr = 3e-4
warmup_iters = 40
max_iters = 500
eval_interval = 100
eval_iters = 20
dtype = "float32"
compile = False  # a cold compile costs more than these runs save
mla_latent_dim = 24
# CPU runs stay off W&B, under train.py's default names
wandb_log = False
wandb_project = "gpt2-ablations"
wandb_run_name = ""
