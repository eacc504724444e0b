"""Micro-benchmarks run by ``numarun bench NAME`` (see ``launcher.commands.bench.BENCHMARKS``)."""
