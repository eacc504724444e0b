"""Drawing: text tables and SVG pictures of a Topology and a LaunchPlan."""
