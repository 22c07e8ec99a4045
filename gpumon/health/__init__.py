"""Health: pure engines over snapshots and events that say what is wrong and what to do, the verdict
over time, and the Slurm integration that acts on it."""
