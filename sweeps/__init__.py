"""Named sweeps, shipped as the package forge_exp.sweeps and put on Hydra's search path by conf/config.yaml
(hydra.searchpath: pkg://forge_exp.sweeps). Each file in sweep/ is one: forge-exp -m +sweep=<file name>."""
