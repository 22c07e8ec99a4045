"""Hardware backends: the only seam between gpumon and the GPUs."""
