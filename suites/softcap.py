# Logit soft-capping against the RA baseline recipe at GPT-2 124M, both on the manual attention path (the
# soft-cap's scores step runs there only), three paired seeds. CPU twin: suites/softcap_shakespeare.py.
# docs/new-idea.md walks through it.
# python sweep.py suites/softcap.py
variants = {"baseline": {"config": "../config/train_ra_baseline.py", "attn_impl": "manual"},
            "softcap": {"config": "../config/train_softcap.py"}}
baseline = "baseline"
seeds = [1, 2, 3]
metric = "val_loss"
min_effect = 0.01  # nats per token: the smallest val-loss difference worth acting on (declared before the runs)
allowed = ["attn_softcap"]
