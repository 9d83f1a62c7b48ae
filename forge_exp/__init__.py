"""forge-exp: a Hydra-configured experiment platform for RL post-training of language models."""

__version__ = "0.1.0"
