#!/usr/bin/env python3
"""Planning time for a large node: 2 packages x 96 cores x 2 threads (384 CPUs), 8 GPUs
(4 per NUMA node), 8 InfiniBand NICs next to them, 12 LLC domains per node.

Prints the median of repeated ``make_plan`` calls for every binding mode; ``--mesh`` instead times the placement of
layouts (docs/layouts.md) on a recorded 8-GPU PCIe box (PIX pairs, PHB quads, SYS across sockets) with a shuffled
CUDA_VISIBLE_DEVICES, the hardest of the recorded machines for the search, beside the same plan without a layout.
Usage: .venv/bin/python scripts/bench_plan.py [--repeat N] [--mesh]
"""

from __future__ import annotations

import argparse
import statistics
import time

from numarun.plan.binding import make_plan
from numarun.plan.model import BindingMode, PlanRequest
from numarun.topology.model import Cpu, Gpu, Nic, NicKind, NumaNode, Topology


def big_topology(
    *, packages: int = 2, cores_per_package: int = 96, threads: int = 2, gpus_per_package: int = 4
) -> Topology:
    total_cores = packages * cores_per_package
    cpus = []
    for t in range(threads):
        for core in range(total_cores):
            pkg = core // cores_per_package
            llc = (core // 8) * 8  # 8-core CCX, id = first CPU sharing the cache
            cpus.append(
                Cpu(
                    id=core + t * total_cores,
                    package=pkg,
                    core=core % cores_per_package,
                    numa_node=pkg,
                    siblings=tuple(core + k * total_cores for k in range(threads)),
                    llc=llc,
                )
            )
    nodes = tuple(
        NumaNode(
            id=p,
            cpus=tuple(c.id for c in cpus if c.numa_node == p),
            memory_bytes=1 << 40,
            distances=tuple(10 if q == p else 32 for q in range(packages)),
        )
        for p in range(packages)
    )
    gpus, nics = [], []
    for i in range(packages * gpus_per_package):
        pkg = i // gpus_per_package
        root = f"0000:{0x10 + 0x20 * i:02x}:01.0"
        gpu_bus = f"0000:{0x11 + 0x20 * i:02x}:00.0"
        gpus.append(Gpu(index=i, pci_bus_id=gpu_bus, numa_node=pkg, pci_path=(root, gpu_bus)))
        nics.append(
            Nic(
                name=f"mlx5_{i}",
                pci_bus_id=f"0000:{0x12 + 0x20 * i:02x}:00.0",
                numa_node=pkg,
                kind=NicKind.INFINIBAND,
                pci_path=(root, f"0000:{0x12 + 0x20 * i:02x}:00.0"),
            )
        )
    return Topology(
        hostname="bench",
        numa_nodes=nodes,
        cpus=tuple(sorted(cpus, key=lambda c: c.id)),
        gpus=tuple(gpus),
        nics=tuple(nics),
        source="built",
    )


MESH_LAYOUTS = (
    "dp_shard=4,tp=2",
    "tp=2,dp_shard=4",
    "dp_shard=2,tp=4",
    "cp=2,dp_shard=2,tp=2",
    "dp_shard=2,cp=2,tp=2",
    "pp=2,dp_shard=2,tp=2",
    "tp=8",
)


def _median_ms(topo: Topology, request: PlanRequest, repeat: int) -> float:
    make_plan(topo, request)  # warm-up (imports, caches)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        make_plan(topo, request)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def mesh(repeat: int) -> None:
    from pathlib import Path

    from numarun.topology.discover import load_topology

    source = Path(__file__).resolve().parent.parent / "tests/fixtures/nvidia-smi/pcie-8gpu-pix-phb-sys-2x14c.txt"
    topo = load_topology(str(source))
    cvd = "0,4,2,6,1,5,3,7"
    base = _median_ms(topo, PlanRequest(cuda_visible_devices=cvd), repeat)
    print(f"{source.name}, CUDA_VISIBLE_DEVICES={cvd}, 8 ranks; make_plan without a layout: median {base:.3f} ms")
    for spec in MESH_LAYOUTS:
        request = PlanRequest(cuda_visible_devices=cvd, mesh=spec)
        ms = _median_ms(topo, request, repeat)
        steps = make_plan(topo, request).mesh.search  # type: ignore[union-attr]
        print(f"--mesh {spec:<22} median {ms:7.3f} ms  (+{ms - base:.3f} ms; search {steps}; {repeat} runs)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=200)
    ap.add_argument("--mesh", action="store_true", help="time the placement of layouts instead")
    args = ap.parse_args()
    if args.mesh:
        mesh(args.repeat)
        return
    topo = big_topology()
    print(
        f"topology: {len(topo.cpus)} CPUs, {len(topo.numa_nodes)} NUMA nodes, {len(topo.gpus)} GPUs, {len(topo.nics)} "
        "NICs"
    )
    for mode in BindingMode:
        request = PlanRequest(binding=mode)
        make_plan(topo, request)  # warm-up (imports, caches)
        times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            make_plan(topo, request)
            times.append(time.perf_counter() - t0)
        median_ms, min_ms = statistics.median(times) * 1e3, min(times) * 1e3
        print(f"make_plan {mode.value:<13} median {median_ms:7.3f} ms  (min {min_ms:.3f} ms, {args.repeat} runs)")


if __name__ == "__main__":
    main()
