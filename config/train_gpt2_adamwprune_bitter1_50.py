# AdamWPrune, state-based pruning to 50% sparsity on the pruning matrix's recipe (AdamW, 10k iters),
# bitter1: |w| (pure magnitude, through Adam-state pruning's code path).
# Same ramp as every run of the matrix (cubic from step 100 to the end, masks every 50 steps).
# python train.py config/train_gpt2_adamwprune_bitter1_50.py
import os

exec(open(os.path.join(os.path.dirname(__file__), "train_gpt2_adamw.py")).read())

out_dir = "out-gpt2-adamwprune-bitter1-50"
wandb_run_name = "gpt2-adamwprune-bitter1-50"
pruning = "state"
prune_score = "bitter1"
target_sparsity = 0.5
