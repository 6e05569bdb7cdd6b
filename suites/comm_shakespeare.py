# The communication study's configs (docs/experiments.md): 24 (all Megatron TP) down to 6 all-reduces per
# forward, tensor parallelism 2 on 2 CPU ranks (gloo): suites/comm.py with
# config/reduced_sync_shakespeare.py.
# The report plots all-reduces per forward against validation loss.
# python sweep.py suites/comm_shakespeare.py
import os

exec(open(os.path.join(os.path.dirname(__file__), "comm.py")).read())
variants = {name: {"config": [body["config"], "../config/reduced_sync_shakespeare.py"]} for name, body in variants.items()}
nproc = 2  # tensor parallelism 2 on 2 CPU ranks (gloo)
