# 12 all-reduces per forward pass: 12 SPD blocks (the reduced-sync study; the same model as
# train_gpt2_12comm.py under the communication study's name).
# torchrun --standalone --nproc_per_node=8 train.py config/train_spd_12sync.py
import os

exec(open(os.path.join(os.path.dirname(__file__), "_reduced_sync_common.py")).read())

block_pattern = "spd"
out_dir = "out-gpt2-124M-spd-12sync"
wandb_run_name = "gpt2-124M-spd-12sync"
