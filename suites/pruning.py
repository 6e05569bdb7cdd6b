# The pruning matrix of the pruning / MLA study (config/sweep_pruning_matrix.py as a suite): dense AdamW (the
# baseline), AdamW-SPAM, SPAM + magnitude pruning to 50%, AdamWPrune bitter0/1/2/3/7 to 50%, all with
# the same cubic sparsity ramp; three paired seeds. The report plots sparsity against perplexity.
# python sweep.py suites/pruning.py
# CPU twin: python data/shakespeare/prepare.py && python sweep.py suites/pruning.py config/small_shakespeare.py
_names = ("adamw", "adamwspam", "adamwspam_magnitude50", "adamwprune_bitter0_50", "adamwprune_bitter1_50",
          "adamwprune_bitter2_50", "adamwprune_bitter3_50", "adamwprune_bitter7_50")
variants = {name: {"config": f"../config/train_gpt2_{name}.py"} for name in _names}
baseline = "adamw"
seeds = [1, 2, 3]
metric = "val_loss"
min_effect = 0.01  # nats per token: the smallest val-loss difference worth acting on (declared before the runs)
allowed = ["optimizer", "pruning", "prune_score", "target_sparsity", "max_iters", "spam_theta", "spam_interval"]
