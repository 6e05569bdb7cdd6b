# The Wikitext-2 experiment template (docs/experiments.md): a small GPT-2 (6 layers, 384 wide, GPT-2 BPE),
# AdamW, a few thousand steps at 16 x 4 x 256 = 16,384 tokens per step, kept constant across the
# runs of a sweep (see config/sweep_wikitext2_*.py).
# python data/wikitext2/prepare.py && python train.py config/train_wikitext2.py
out_dir = "out-wikitext2"
dataset = "wikitext2"
wandb_log = True
wandb_run_name = "wikitext2"

n_layer = 6
n_head = 6
n_embd = 384
block_size = 256
dropout = 0.1  # ~2M training tokens: a few thousand steps see each token several times

batch_size = 16
gradient_accumulation_steps = 0
tokens_per_iter = 16384  # 16 x 4 x 256

optimizer = "adamw"
learning_rate = 6e-4
weight_decay = 0.1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0
lr_schedule = "cosine"
warmup_iters = 200
min_lr = 6e-5
max_iters = 3000

eval_interval = 200
eval_iters = 40
log_interval = 10
