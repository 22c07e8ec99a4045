"""``gpumon burn``: burn-in and fault triage that names the bad GPU, link or rank.

Three parts: ``workloads`` (what runs on the GPUs), ``orchestration`` (processes, hosts,
watchdog, live view) and ``verdict`` (judge, thresholds, report, exit codes); ``command`` on top.
The files a burn leaves, which the daemon reads, live below the features in ``gpumon.state``.
torch is imported only inside this package and only inside functions, so importing
``gpumon.burn.command`` never loads it (nor does the daemon's gpumon.exposition.burn_results). See docs/burn.md.
"""
