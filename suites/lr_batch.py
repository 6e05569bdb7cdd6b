# Learning rate x batch (the Wikitext-2 template, config/sweep_wikitext2_lr_batch.py as a suite): the token
# budget is held equal, so smaller batches take more steps; the report draws a heatmap.
# python sweep.py suites/lr_batch.py
# CPU twin: python data/shakespeare/prepare.py && python sweep.py suites/lr_batch.py config/small_shakespeare.py --max_tokens=1048576
base = ["../config/train_wikitext2.py"]
variants = {f"lr{lr:g}_b{batch}": {"learning_rate": lr, "batch_size": batch}
            for lr in (3e-4, 6e-4, 1e-3, 2e-3) for batch in (8, 16, 32, 64)}
overrides = {"tokens_per_iter": 0, "gradient_accumulation_steps": 1, "max_tokens": 16384 * 3000, "max_iters": 10**9,
             "min_lr": 3e-5}
baseline = "lr0.0006_b16"
seeds = [1, 2, 3]
metric = "val_loss"
min_effect = 0.01  # nats per token: the smallest val-loss difference worth acting on (declared before the runs)
allowed = ["learning_rate", "batch_size", "tokens_per_iter"]
heatmap = ["learning_rate", "batch_size"]
