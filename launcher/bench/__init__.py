"""Micro-benchmarks run by ``numarun bench NAME`` (see ``numarun.commands.bench.BENCHMARKS``)."""
