# Overlay: the CPU twin of any reduced-synchronization config given before it (train_gpt2_*comm.py,
# train_*sync.py): the same 12-layer block pattern, narrow, on 2 CPU ranks (tensor parallelism 2,
# one replica) in a few minutes (the 50k-token embedding and head dominate at this width).
# python data/shakespeare/prepare.py
# torchrun --standalone --nproc_per_node=2 train.py config/train_gpt2_12comm.py config/reduced_sync_shakespeare.py --out_dir=out-shakespeare-12comm
# (python train.py with the same arguments runs the same model simulated in one process)
# python sweep.py suites/comm_shakespeare.py   (suites/comm.py with this overlay; also sync_shakespeare.py)
out_dir = "out-reduced-sync-shakespeare"  # one per variant: pass --out_dir
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
