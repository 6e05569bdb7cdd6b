# The pruning / MLA study's baseline to beat (perplexity 42.82 at 10k iterations, docs/experiments.md):
# AdamW-SPAM with magnitude pruning of every Linear weight (the tied embedding/head excluded) to 50%
# sparsity, cubic ramp from step 100 to the last iteration, masks every 50 steps. The study's runs used a
# linear ramp; compare methods only under the same prune_ramp.
# python train.py config/train_gpt2_adamwspam_magnitude50.py
import os

exec(open(os.path.join(os.path.dirname(__file__), "train_gpt2_adamwspam.py")).read())

out_dir = "out-gpt2-adamwspam-magnitude50"
wandb_run_name = "gpt2-adamwspam-magnitude50"
pruning = "magnitude"
target_sparsity = 0.5
