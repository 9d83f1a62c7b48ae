"""Generation engines behind one interface (`base.Engine`): the torch-native engine (`native.NativeEngine`,
`generator=torch`) and, written against the same interface, a vLLM backend. Pure layer: no monarch, mlflow or hydra.

Submodules are imported where they are used (`from forge_exp.generators.native import NativeEngine`), so importing
the interface does not pull in the engines.
"""

from forge_exp.generators.base import Engine, Generation, Sampling

__all__ = ["Engine", "Generation", "Sampling"]
