"""forge-exp's submitit launchers (launcher.py). Hydra only instantiates launchers defined under the
`hydra_plugins` namespace package and found by its plugin scan: hence this package, shipped next to forge_exp."""
