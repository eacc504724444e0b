"""Planning: Topology + request -> LaunchPlan. Pure: no I/O, no torch import."""

from .model import BindingMode, GpuRef, LaunchPlan, MemPolicy, PlanRequest, RankBinding

__all__ = ["BindingMode", "GpuRef", "LaunchPlan", "MemPolicy", "PlanRequest", "RankBinding"]
