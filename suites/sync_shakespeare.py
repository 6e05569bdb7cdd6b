# Grouped and selective synchronization (seeds/003): SPD-12, parallel blocks synced every 2/3/4/6
# layers, and 9 selected sync points, against all-TP (24 all-reduces per forward); CPU twin of suites/sync.py.
# python sweep.py suites/sync_shakespeare.py
variants = {"24comm": {"config": "../config/train_gpt2_24comm_shakespeare.py"},
            "spd12": {"config": "../config/train_spd_12sync_shakespeare.py"},
            **{f"grouped{n}": {"config": f"../config/train_grouped_{n}sync_shakespeare.py"} for n in (2, 3, 4, 6)},
            "selective9": {"config": "../config/train_selective_9sync_shakespeare.py"}}
baseline = "24comm"
seeds = [1, 2, 3]
metric = "val_loss"
allowed = ["block_pattern", "sync_every", "sync_layers"]
nproc = 2
