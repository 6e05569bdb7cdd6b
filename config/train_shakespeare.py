# A small GPT on the Shakespeare plays: 300 steps on 2 CPU cores in about 2.5 minutes, val loss
# 10.8 -> 5.5, then a sample.
# python data/shakespeare/prepare.py && python train.py config/train_shakespeare.py
out_dir = "out-shakespeare"
dataset = "shakespeare"
eval_interval = 100
eval_iters = 10
log_interval = 10
sample_tokens = 200

n_layer = 4
n_head = 4
n_embd = 128
block_size = 128
batch_size = 8
gradient_accumulation_steps = 1
dropout = 0.0

learning_rate = 2e-3
min_lr = 2e-4
warmup_iters = 30
max_iters = 300
weight_decay = 0.1
beta2 = 0.99  # small batches: a longer second-moment average is steadier
