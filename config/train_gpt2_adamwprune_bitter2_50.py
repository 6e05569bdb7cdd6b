# AdamWPrune, state-based pruning to 50% sparsity on the pruning matrix's recipe (AdamW),
# bitter2: bitter1's |w| score with 21% more iterations (12,100), AdamWPrune's "scale-aware"
# variant. Its budget differs from the rest of the matrix (10k): read bitter2 vs bitter1 as a
# budget effect, not as a better score. Cubic ramp from step 100 to the end, masks every 50 steps.
# python train.py config/train_gpt2_adamwprune_bitter2_50.py
import os

exec(open(os.path.join(os.path.dirname(__file__), "train_gpt2_adamw.py")).read())

out_dir = "out-gpt2-adamwprune-bitter2-50"
wandb_run_name = "gpt2-adamwprune-bitter2-50"
pruning = "state"
prune_score = "bitter2"
target_sparsity = 0.5
max_iters = 12100  # +21%: the sparsity ramp and the cosine stretch with it
