# Grouped and selective synchronization (the reduced-sync study, docs/experiments.md): SPD-12, parallel
# blocks synced every 2/3/4/6 layers, and 9 selected sync points, against all-TP (24 all-reduces per
# forward); CPU twin: suites/sync.py with config/reduced_sync_shakespeare.py.
# python sweep.py suites/sync_shakespeare.py
import os

exec(open(os.path.join(os.path.dirname(__file__), "sync.py")).read())
variants = {name: {"config": [body["config"], "../config/reduced_sync_shakespeare.py"]} for name, body in variants.items()}
nproc = 2  # tensor parallelism 2 on 2 CPU ranks (gloo)
