# Grouped and selective synchronization (the reduced-sync study, docs/experiments.md): SPD-12, parallel
# blocks synced every 2/3/4/6 layers, and 9 selected sync points, against all-TP (24 all-reduces per
# forward). CPU twin: suites/sync_shakespeare.py.
# python sweep.py suites/sync.py
variants = {"24comm": {"config": "../config/train_gpt2_24comm.py"},
            "spd12": {"config": "../config/train_spd_12sync.py"},
            **{f"grouped{n}": {"config": f"../config/train_grouped_{n}sync.py"} for n in (2, 3, 4, 6)},
            "selective9": {"config": "../config/train_selective_9sync.py"}}
baseline = "24comm"
seeds = [1, 2, 3]
metric = "val_loss"
min_effect = 0.01  # nats per token: the smallest val-loss difference worth acting on (declared before the runs)
allowed = ["block_pattern", "sync_every", "sync_layers"]
nproc = 8
