"""The operational half of the training loops, so that apps/ reads as the algorithm:

    steps.py       which steps run (a resume continues after its checkpoint), the opening evaluation, logging, the
                   checkpoint cadence, the progress bar: every loop (apps/sft.py, apps/grpo.py)
    overlap.py     rollouts and training at once (apps/grpo.py): the policy-age gate, the next batch taken while a
                   step trains, a quiet moment for a checkpoint, stop signals between steps, the reward watch and
                   the stall warning
    checkpoint.py  checkpoints on disk, resume, the rollout seeds
    faults.py      how a run ends when it does not finish: stop signals, failures, exit codes

It sits between the apps and the actors: it talks to services through handles, never imports monarch, and knows no
algorithm.
"""
