# GPT-2 124M on FineWeb-Edu with the pruning / MLA study's recipe (docs/experiments.md): block 1024, 128 sequences =
# 131,072 tokens per step, AdamW lr 6e-4, weight decay 0.1, 2000 warmup steps, cosine to 6e-5,
# eval every 500, bf16, compiled. The study's micro-batch 32 x 4 is the same step; 16 x 8 divides
# by 1, 2, 4 and 8 GPUs (gradient_accumulation_steps counts micro-steps over all ranks).
# python data/finewebedu/prepare.py && python train.py config/train_gpt2.py
# torchrun --standalone --nproc_per_node=8 train.py config/train_gpt2.py  (8 ranks x 1 micro-step)
# torchrun --standalone --nproc_per_node=4 train.py config/train_gpt2.py  (4 ranks x 2 micro-steps)
out_dir = "out-gpt2-124M"
dataset = "finewebedu"
wandb_log = True
wandb_run_name = "gpt2-124M"

n_layer = 12
n_head = 12
n_embd = 768
block_size = 1024
dropout = 0.0
bias = True

batch_size = 16
gradient_accumulation_steps = 8  # total over all ranks

optimizer = "adamw"
learning_rate = 6e-4
weight_decay = 0.1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0
lr_schedule = "cosine"
warmup_iters = 2000
min_lr = 6e-5
max_iters = 50000

eval_interval = 500
eval_iters = 50
log_interval = 10
dtype = "bfloat16"
compile = True
