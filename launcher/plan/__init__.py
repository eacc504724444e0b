"""Planning: Topology + request -> LaunchPlan. Pure: no I/O, no torch import."""
