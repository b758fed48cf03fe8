"""One training run and its parts: run.py (config in, run directory out), module.py (the LightningModule),
metrics_log.py (train rows, console lines, the host-sync clock), evaluations.py (validation bpb, CORE, attention
diagnostics on schedules), checkpoints.py, preemption.py and sole_writer.py (the run directory's lock in a run)."""
