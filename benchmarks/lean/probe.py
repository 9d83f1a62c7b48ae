"""An actor that reports what its process holds: pid, PSS/RSS, seconds since the process started, and which heavy
packages are imported. benchmarks/lean/profile_forge.py spawns one on every proc mesh of a run (benchmark only)."""

from __future__ import annotations

import sys
import time

from monarch.actor import Actor, endpoint

HEAVY = ("torch", "transformers", "tokenizers", "safetensors", "datasets", "mlflow", "sqlalchemy", "pandas", "hydra",
         "omegaconf", "numpy", "monarch")


def report() -> dict:
    import psutil

    p = psutil.Process()
    mem = p.memory_full_info()
    return {"pid": p.pid, "pss_mib": round(mem.pss / 2**20), "rss_mib": round(mem.rss / 2**20),
            "uss_mib": round(mem.uss / 2**20), "age_s": round(time.time() - p.create_time(), 2),
            "modules": len(sys.modules), "heavy": [h for h in HEAVY if h in sys.modules]}


class Probe(Actor):
    @endpoint
    async def report(self) -> dict:
        return report()
