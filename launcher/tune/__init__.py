"""``numarun tune``: run a short job once per candidate setting and keep the fastest.

Pure parts, no I/O: :mod:`.candidates` (the settings to try), :mod:`.schedule` (the order
runs alternate in), :mod:`.stats` (medians, ratios, the winner, table and JSON),
:mod:`.measure` (throughput from a run's files, given their text) and :mod:`.chart` (SVG).
The runner that starts processes is ``numarun.commands.tune``.
"""
