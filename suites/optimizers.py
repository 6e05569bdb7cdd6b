# SGD with momentum, Adam and AdamW (the Wikitext-2 template), each at a learning rate of its own regime, the same
# tokens per step and iterations; three paired seeds.
# python sweep.py suites/optimizers.py
# CPU twin: python data/shakespeare/prepare.py && python sweep.py suites/optimizers.py config/small_shakespeare.py
base = ["../config/train_wikitext2.py"]
variants = {"adamw": {"optimizer": "adamw", "learning_rate": 6e-4}, "adam": {"optimizer": "adam", "learning_rate": 6e-4},
            "sgd": {"optimizer": "sgd", "learning_rate": 0.1}}
overrides = {"min_lr": 0.0}
baseline = "adamw"
seeds = [1, 2, 3]
metric = "val_loss"
min_effect = 0.01  # nats per token: the smallest val-loss difference worth acting on (declared before the runs)
allowed = ["optimizer", "learning_rate"]
