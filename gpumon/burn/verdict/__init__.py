"""What a burn concludes: the judge (every figure against peers and floors, naming the GPU, link
or rank), the thresholds it judges by, the report and the exit codes.

Pure functions over JSON-ready data: no torch, no processes.
"""
