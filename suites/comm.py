# The communication study's configs (docs/experiments.md): 24 (all Megatron TP) down to 6 all-reduces per
# forward, tensor parallelism 2 x 4 data-parallel replicas on 8 GPUs, GPT-2 124M on OpenWebText. CPU twin:
# suites/comm_shakespeare.py.
# The report plots all-reduces per forward against validation loss.
# python sweep.py suites/comm.py
variants = {f"{n}comm": {"config": f"../config/train_gpt2_{n}comm.py"} for n in (24, 18, 16, 12, 8, 6)}
baseline = "24comm"
seeds = [1, 2, 3]
metric = "val_loss"
min_effect = 0.01  # nats per token: the smallest val-loss difference worth acting on (declared before the runs)
allowed = ["block_pattern"]
nproc = 8
