"""Every set of named choices a config field can take, defined once. The pure layers dispatch on these names
(rl/kl.py, rl/advantages.py, ...), the schemas in config/ type their fields with them; nothing heavy is imported
here, so the CLI can check a config before torch loads."""

KL_ESTIMATORS = ("k1", "k2", "k3")  # rl/kl.py (Schulman 2020)
LOSS_AGGREGATIONS = ("token_mean", "seq_mean", "fixed_horizon")  # rl/losses/primitives.py
ADVANTAGES = ("group_norm", "mean", "loo")  # rl/advantages.py
TARGET_FORMATS = ("gsm8k", "boxed", "raw")  # data/hf.py: extract_target
DTYPES = ("float32", "bfloat16", "float16")  # models/hf.py
ATTENTION = ("sdpa", "eager")  # transformers attn_implementation
