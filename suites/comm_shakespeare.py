# The communication configs of seeds/002: 24 (all Megatron TP) down to 6 all-reduces per forward,
# tensor parallelism 2 on 2 CPU ranks (gloo), the twin of suites/comm.py.
# The report plots all-reduces per forward against validation loss.
# python sweep.py suites/comm_shakespeare.py
variants = {f"{n}comm": {"config": f"../config/train_gpt2_{n}comm_shakespeare.py"} for n in (24, 18, 16, 12, 8, 6)}
baseline = "24comm"
seeds = [1, 2, 3]
metric = "val_loss"
allowed = ["block_pattern"]
nproc = 2
