# The pruning matrix of the pruning / MLA study (docs/experiments.md): dense AdamW and AdamW-SPAM,
# AdamW-SPAM + magnitude pruning to 50% (the baseline to beat, ppl 42.82), AdamWPrune bitter0/1/2/3/7 to
# 50%; all at the recipe of config/train_gpt2_adamw.py with the same cubic sparsity ramp.
# python sweep.py config/sweep_pruning_matrix.py
# python sweep.py config/sweep_pruning_matrix.py config/small_shakespeare.py   (CPU, minutes per run)
import os

_here = os.path.dirname(__file__)
grid = {"config": [os.path.join(_here, name) for name in (
    "train_gpt2_adamw.py", "train_gpt2_adamwspam.py", "train_gpt2_adamwspam_magnitude50.py",
    "train_gpt2_adamwprune_bitter0_50.py", "train_gpt2_adamwprune_bitter1_50.py",
    "train_gpt2_adamwprune_bitter2_50.py", "train_gpt2_adamwprune_bitter3_50.py",
    "train_gpt2_adamwprune_bitter7_50.py")]}
sweep_dir = "out-sweep-pruning-matrix"
