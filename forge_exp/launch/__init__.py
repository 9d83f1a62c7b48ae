"""The Hydra and submitit glue: the sweep callback (sweep.py) and the launcher resources (resources.py)."""
