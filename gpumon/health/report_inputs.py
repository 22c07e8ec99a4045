"""What a health report reads besides the engines' memory, taken once for each report: the stamps of the
files it reads (operator clears, the inventory baseline, the last burn's results) and the running burn's
marker. The cached report (``HealthService.current_report``) holds while these, the very snapshot and the
service's input count are the same; a report that is made reads its files by these same stamps, so each
file is looked at once a report, not once for the key and again for the report."""

from __future__ import annotations

from dataclasses import dataclass

from gpumon.state.burn_marker import BurnHoldBack
from gpumon.util.file_stamp import FileStamp


@dataclass(frozen=True)
class ReportInputs:
    """The inputs of one health report that are not in the health service's memory."""

    generation: int
    """The service's input count (a snapshot, an XID, an accepted inventory each add one)."""
    clears: tuple[FileStamp | None, ...]
    """The stamps of the clears' files and folders (gpumon.health.clears_watch.ClearsWatch.paths), in order."""
    inventory: FileStamp | None
    """The stamp of ``inventory.json``, None when absent."""
    burn_results: FileStamp | None
    """The stamp of the last burn's results file, None when absent."""
    burn: BurnHoldBack | None
    """The running burn (its marker), None when none runs."""
