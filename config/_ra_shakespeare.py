# Shared by the *_shakespeare RA configs: the CPU twin of the RA ablation, the same for every
# variant (suites/ra_shakespeare.py runs baseline, early, late, all, learned x 3 paired seeds).
# python data/shakespeare/prepare.py --tokenizer=char && python train.py config/train_ra_late_shakespeare.py
# Why these settings:
# - Characters, not GPT-2 tokens: with GPT-2's 50k vocabulary the head held 6.4M of the 7.2M
#   parameters and most of the FLOPs, so a twin measured its head more than its attention. Here
#   the blocks hold nearly all of the 0.46M parameters and the compute.
# - 96 wide, 2,048 tokens per step for 500 steps (1M characters, ~0.2 epochs of the 4.5M), cosine
#   decay to a tenth. The old twin (300 steps of 1,024 GPT-2 tokens) compared runs while the loss was
#   still falling fast, so the seed (init and data order) moved it by 0.36. Measured here, baseline
#   val loss at step 500 over seeds 1, 2, 3: 2.1719, 2.1788, 2.2029 (sd 0.016; 128 wide and 400 steps
#   gave 2.2228 and 2.1897 for seeds 1 and 2). Narrower and longer is also cheaper: ~3.3 MFLOP per
#   token instead of 5.6, so 15 runs fit in the suite's time budget on 2 cores.
# - 20 evaluation batches (41k characters, the same windows in every run).
# - float32: the same numbers on CPUs with and without bf16 (emulated bf16 is ~400x slower).
# - MLA latent 24 = n_embd / 4 (the GPT-2 configs use 128 of 768).
import os

exec(open(os.path.join(os.path.dirname(__file__), "train_shakespeare.py")).read())
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
mla_latent_dim = 24
