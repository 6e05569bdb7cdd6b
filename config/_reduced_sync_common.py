# Shared by the reduced-synchronization experiments (train_gpt2_*comm.py, train_*sync.py), which exec
# it and set only their block pattern and names. The recipe of the communication and reduced-sync
# studies (docs/experiments.md): GPT-2 124M on OpenWebText for 20k steps, micro-batch 12 x 1024 tokens,
# 40 micro-steps per step in total (5 x 8 GPUs), AdamW lr 6e-4 cosine to 6e-5, 2000 warmup steps, W&B
# project 'owt'.
# Layout: 8 GPUs = 4 data-parallel replicas x tensor parallelism over 2 ranks (tp_size).
# python data/openwebtext/prepare.py
# torchrun --standalone --nproc_per_node=8 train.py config/train_gpt2_12comm.py
model_type = "reduced_sync"
tp_size = 2
dataset = "openwebtext"
wandb_log = True
wandb_project = "owt"

n_layer = 12
n_head = 12
n_embd = 768
block_size = 1024
dropout = 0.0
bias = True

batch_size = 12
gradient_accumulation_steps = 40  # total over the data-parallel replicas: 10 each on 8 GPUs

learning_rate = 6e-4
weight_decay = 0.1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0
lr_schedule = "cosine"
warmup_iters = 2000
min_lr = 6e-5
max_iters = 20000
lr_decay_iters = 20000

eval_interval = 1000
eval_iters = 200
log_interval = 10
dtype = "bfloat16"
compile = True
