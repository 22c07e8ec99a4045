"""What one feature leaves on disk for the others: the burn's record (``last.json``) and its running marker.

``gpumon burn`` writes them (``burn_record``); the alerts, health and the exposition read them
(``burn_marker``, ``burn_record``'s names) without importing the burn, which is a feature beside them.
"""
