"""The outside world a finding acts on: Slurm (scontrol), node-problem-detector output."""
