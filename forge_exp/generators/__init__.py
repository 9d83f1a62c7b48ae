"""Generation engines (`generator=` in config): the torch-native one and vLLM, behind one interface (base.py)."""
