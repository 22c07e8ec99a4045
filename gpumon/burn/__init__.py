"""``gpumon burn``: burn-in and fault triage that names the bad GPU, link or rank.

Three parts: ``workloads`` (what runs on the GPUs), ``orchestration`` (processes, hosts,
watchdog, live view) and ``verdict`` (judge, thresholds, report, exit codes); ``cli`` on top.
torch is imported only inside this package and only inside functions, so importing
``gpumon.burn.cli`` or ``gpumon.burn.results_collector`` never loads it. See docs/burn.md.
"""
