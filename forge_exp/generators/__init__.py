"""Generation engines behind one interface (base.py): the torch-native engine and vLLM (vllm.py, an extra)."""
