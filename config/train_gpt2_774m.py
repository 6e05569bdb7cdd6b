# GPT-2 Large (published 774M parameters: 36 layers, 20 heads, width 1280) on FineWeb-Edu with the
# notes' recipe (seeds/001, config/train_gpt2.py): block 1024, 128 sequences = 131,072 tokens per step,
# AdamW, weight decay 0.1, 2000 warmup steps, cosine to lr/10, bf16, compiled (block by block under
# FSDP). Peak learning rate from GPT-3's table for this size (2.5e-4). The notes' "Different model
# sizes" (seeds/002).
#
# Memory per GPU on 8 GPUs, from sharding.memory_estimate (the start-up checklist prints it for the
# actual layout), micro-batch 16, bf16:
#   DDP  35.4 GiB (weights 2.9, grads 2.9, Adam 5.8, activations 23.9)   -> a 40 GB GPU, barely
#   FSDP 25.4 GiB (weights 0.4, grads 0.4, Adam 0.7, activations 23.9)   -> a 40 GB GPU
#   activation_checkpointing=True: DDP 13.6 GiB, FSDP 3.6 GiB
#   (the chunked head never holds the logits; head_loss='full' adds 6.1 GiB)
# python data/finewebedu/prepare.py
# torchrun --standalone --nproc_per_node=8 train.py config/train_gpt2_774m.py
out_dir = "out-gpt2-774M"
dataset = "finewebedu"  # or "openwebtext"
wandb_log = True
wandb_run_name = "gpt2-774M"

n_layer = 36
n_head = 20
n_embd = 1280
block_size = 1024
dropout = 0.0
bias = True

batch_size = 16
gradient_accumulation_steps = 8  # total over all ranks: 1 micro-step per rank on 8 GPUs
data_parallel = "fsdp"

optimizer = "adamw"
learning_rate = 2.5e-4
min_lr = 2.5e-5
weight_decay = 0.1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0
lr_schedule = "cosine"
warmup_iters = 2000
max_iters = 50000

eval_interval = 500
eval_iters = 50
log_interval = 10
dtype = "bfloat16"
compile = True
