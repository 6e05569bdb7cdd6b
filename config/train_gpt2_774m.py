# GPT-2 Large (published 774M parameters: 36 layers, 20 heads, width 1280) on FineWeb-Edu with the
# pruning / MLA study's recipe (config/train_gpt2.py, executed below; docs/experiments.md): block
# 1024, 128 sequences = 131,072 tokens per step, AdamW, weight decay 0.1, 2000 warmup steps, cosine
# to lr/10, bf16, compiled (block by block under FSDP). Peak learning rate from GPT-3's table for
# this size (2.5e-4). The communication study's "different model sizes".
#
# Memory per GPU on 8 GPUs, from sharding.memory_estimate (the start-up checklist prints it for the
# actual layout), micro-batch 16, bf16:
#   DDP  41.3 GiB (weights 2.9, grads 2.9, Adam 5.8, activations 23.9, head 0.5, overhead 5.3) -> a 48 GB GPU
#   FSDP 26.9 GiB (weights 0.4, grads 0.4, Adam 0.7, activations 23.9, head 0.5, overhead 1.0) -> a 40 GB GPU
#   activation_checkpointing=True: DDP 18.9 GiB, FSDP 4.6 GiB in a step; 24.5 and 10.2 GiB evaluating
#   (the chunked head holds one chunk of logits; head_loss='full' adds 6.1 GiB; evaluation holds a
#   batch's whole logits, 7.7 GiB)
# python data/finewebedu/prepare.py
# torchrun --standalone --nproc_per_node=8 train.py config/train_gpt2_774m.py
import os

exec(open(os.path.join(os.path.dirname(__file__), "train_gpt2.py")).read())
out_dir = "out-gpt2-774M"
wandb_run_name = "gpt2-774M"
n_layer = 36
n_head = 20
n_embd = 1280
batch_size = 16
gradient_accumulation_steps = 8  # total over all ranks: 1 micro-step per rank on 8 GPUs, 131,072 tokens per step
data_parallel = "fsdp"
learning_rate = 2.5e-4
min_lr = 2.5e-5
