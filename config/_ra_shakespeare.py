# Shared by the *_shakespeare RA configs: config/train_shakespeare.py (4 layers, 128 wide, 300
# steps: minutes on 2 CPU cores) with model_type='ra'. Same optimizer, batch and budget for all.
import os

exec(open(os.path.join(os.path.dirname(__file__), "train_shakespeare.py")).read())
model_type = "ra"
sample_tokens = 0
mla_latent_dim = 32  # MLA runs only: n_embd / 4 (the GPT-2 configs use 128 of 768)
