"""Trainer backends beyond the transformers one in trainers/update.py: the sharded TorchTitan engine (trainers/titan.py).

Pure layers: no monarch, mlflow or hydra imports (runtime/torch_world.py sets up the torch.distributed world that
the engine runs in). TorchTitan is an extra: `pip install 'forge-exp[titan]'`.
"""
