# AdamW-SPAM (optim.AdamWSPAM) on the pruning matrix's recipe: AMSGrad, element clipping at
# theta = 50, spike z-score 2 over the last 100 gradient norms, m/v reset every 1000 steps with a
# 1000-step cosine lr re-warm (the defaults of the spam_* keys in train.py).
# python train.py config/train_gpt2_adamwspam.py
import os

exec(open(os.path.join(os.path.dirname(__file__), "train_gpt2_adamw.py")).read())

out_dir = "out-gpt2-adamwspam"
wandb_run_name = "gpt2-adamwspam"
optimizer = "adamw_spam"
