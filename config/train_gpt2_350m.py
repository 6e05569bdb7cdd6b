# GPT-2 Medium (published 355M parameters: 24 layers, 16 heads, width 1024) on FineWeb-Edu with the
# pruning / MLA study's recipe (config/train_gpt2.py, executed below; docs/experiments.md): block 1024,
# 128 sequences = 131,072 tokens per step, AdamW, weight decay 0.1, 2000 warmup steps, cosine to lr/10,
# bf16, compiled. The peak learning rate follows GPT-3's table for this size (3e-4; 6e-4 is the 124M's).
# The communication study's "different model sizes": the same recipe at 350M and 774M.
#
# Memory per GPU on 8 GPUs, from sharding.memory_estimate (the start-up checklist prints it for the
# actual layout), micro-batch 16, bf16:
#   DDP  21.5 GiB (weights 1.3, grads 1.3, Adam 2.6, activations 12.8, head 0.4, overhead 3.0) -> a 24 GB GPU and up
#   FSDP 14.9 GiB (weights 0.2, grads 0.2, Adam 0.3, activations 12.8, head 0.4, overhead 1.0)
#   activation_checkpointing=True: DDP 9.6 GiB, FSDP 3.0 GiB in a step; 15.9 and 9.4 GiB evaluating
#   (the chunked head holds one chunk of logits; head_loss='full' adds 6.1 GiB; evaluation holds a
#   batch's whole logits, 7.7 GiB)
# DDP is the default here: the states are small next to the activations.
# python data/finewebedu/prepare.py
# torchrun --standalone --nproc_per_node=8 train.py config/train_gpt2_350m.py
import os

exec(open(os.path.join(os.path.dirname(__file__), "train_gpt2.py")).read())
out_dir = "out-gpt2-350M"
wandb_run_name = "gpt2-350M"
n_layer = 24
n_head = 16
n_embd = 1024
batch_size = 16
gradient_accumulation_steps = 8  # total over all ranks: 1 micro-step per rank on 8 GPUs, 131,072 tokens per step
data_parallel = "ddp"
learning_rate = 3e-4
min_lr = 3e-5
