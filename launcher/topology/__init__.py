"""Topology: the frozen model of one node, and the code that reads it (discovery)."""
