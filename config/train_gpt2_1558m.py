# GPT-2 XL (published 1558M parameters: 48 layers, 25 heads, width 1600) on FineWeb-Edu with the
# pruning / MLA study's recipe (config/train_gpt2.py, executed below; docs/experiments.md): block
# 1024, 128 sequences = 131,072 tokens per step, AdamW, weight decay 0.1, 2000 warmup steps, cosine
# to lr/10, bf16, compiled block by block. Peak learning rate from GPT-3's table for this size
# (2e-4).
#
# Memory per GPU on 8 GPUs, from sharding.memory_estimate (the start-up checklist prints it for the
# actual layout), micro-batch 16, bf16:
#   DDP  73.3 GiB (weights 5.8, grads 5.8, Adam 11.6, activations 39.8, head 0.5, overhead 9.7) -> an 80 GB GPU only
#   FSDP 44.4 GiB (weights 0.8, grads 0.7, Adam 1.5, activations 39.8, head 0.5, overhead 1.0) -> a 48 GB GPU
#   activation_checkpointing=True: DDP 36.1 GiB, FSDP 7.2 GiB in a step; 40.6 and 11.7 GiB evaluating
#   (the chunked head holds one chunk of logits; head_loss='full' adds 6.1 GiB; evaluation holds a
#   batch's whole logits, 7.7 GiB)
# On several nodes use data_parallel="hsdp" (shard within a node, replicate across): README,
# "Multi-node runs", and slurm/train_multinode.sbatch.
# python data/finewebedu/prepare.py
# torchrun --standalone --nproc_per_node=8 train.py config/train_gpt2_1558m.py
import os

exec(open(os.path.join(os.path.dirname(__file__), "train_gpt2.py")).read())
out_dir = "out-gpt2-1558M"
wandb_run_name = "gpt2-1558M"
n_layer = 48
n_head = 25
n_embd = 1600
batch_size = 16
gradient_accumulation_steps = 8  # total over all ranks: 1 micro-step per rank on 8 GPUs, 131,072 tokens per step
data_parallel = "fsdp"
learning_rate = 2e-4
min_lr = 2e-5
