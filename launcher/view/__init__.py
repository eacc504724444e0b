"""Drawing: text tables and SVG pictures of a Topology and a LaunchPlan.

This layer sits above ``topology`` and ``plan`` and reads both; neither imports it.
"""
