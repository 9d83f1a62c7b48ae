"""Generation engines behind one interface (`base.Engine`): the torch-native engine (`native.NativeEngine`,
`generator=torch`) and, written against the same interface, a vLLM backend. Pure layer: no monarch, mlflow or hydra.

Submodules are imported where they are used (`from forge_exp.generators.native import NativeEngine`), and the
interface's names load on first use, so importing the engines' torch-free knobs (`options.py`, which the config
registers as their schemas) does not pull in torch or the engines.
"""

__all__ = ["Engine", "Generation", "Sampling"]


def __getattr__(name: str):
    if name in __all__:
        from forge_exp.generators import base

        return getattr(base, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
