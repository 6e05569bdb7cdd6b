# Overlay: any reduced-synchronization recipe given before it (train_gpt2_*comm.py,
# train_grouped_*sync.py, train_selective_9sync.py, train_spd_12sync.py) at CPU size: the same
# 12-layer block pattern, narrow, on 2 CPU ranks (tensor parallelism 2) in a few minutes.
# python data/shakespeare/prepare.py
# torchrun --standalone --nproc_per_node=2 train.py config/train_gpt2_12comm.py config/reduced_sync_shakespeare.py
# (plain `python train.py ...` runs the same model simulated in one process)
out_dir = "out-reduced-sync-shakespeare"
dataset = "shakespeare"
wandb_log = False
n_layer = 12  # the patterns (sync_every, sync_layers) are written for 12 layers
n_head = 4
n_embd = 64
block_size = 64
batch_size = 8
gradient_accumulation_steps = 2
learning_rate = 2e-3
min_lr = 2e-4
beta2 = 0.99
warmup_iters = 20
max_iters = 100
lr_decay_iters = 100
eval_interval = 25
eval_iters = 5
log_interval = 10
dtype = "float32"
compile = False
