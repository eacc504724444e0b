"""set_mempolicy on every architecture: the syscall number table, the libnuma fallback, and neither."""

from __future__ import annotations

import ctypes.util
import errno
import logging
import re
from pathlib import Path

import pytest

from numarun.worker import affinity
from numarun.worker.affinity import SYSCALLS, Mpol, _Mempolicy

# Linux architectures torch publishes wheels for (and the other 64-bit ones it builds on)
TORCH_ARCHES = ("x86_64", "aarch64", "ppc64le", "s390x", "riscv64")

# Kernel UAPI headers that carry the numbers, when the host has them (linux-libc-dev and
# its cross variants); each maps to the machines it defines.
HEADERS = {
    "/usr/include/x86_64-linux-gnu/asm/unistd_64.h": ("x86_64", "amd64"),
    "/usr/include/asm-generic/unistd.h": ("aarch64", "arm64", "riscv64", "loongarch64"),
    "/usr/powerpc64le-linux-gnu/include/asm/unistd_64.h": ("ppc64le", "ppc64"),
    "/usr/s390x-linux-gnu/include/asm/unistd_64.h": ("s390x",),
}


def test_every_torch_architecture_has_numbers() -> None:
    assert set(TORCH_ARCHES) <= set(SYSCALLS)
    for machine, (set_nr, get_nr) in SYSCALLS.items():
        assert set_nr != get_nr and abs(set_nr - get_nr) == 1, machine


@pytest.mark.parametrize("header", sorted(HEADERS))
def test_numbers_match_the_kernel_headers(header: str) -> None:
    path = Path(header)
    if not path.exists():
        pytest.skip(f"{header} not installed")
    text = path.read_text()
    found = {name: int(n) for name, n in re.findall(r"#define __NR_(set_mempolicy|get_mempolicy)\s+(\d+)", text)}
    for machine in HEADERS[header]:
        assert SYSCALLS[machine] == (found["set_mempolicy"], found["get_mempolicy"]), machine


def test_this_machine_uses_its_syscall_numbers() -> None:
    backend = affinity.mempolicy_backend()
    assert backend.numbers is not None


def _roundtrip(backend: _Mempolicy) -> tuple[int, tuple[int, ...]]:
    """set_mempolicy(PREFERRED, node 0) through ``backend``, read it back, restore the default."""
    old = affinity.mempolicy_backend
    affinity.mempolicy_backend = lambda: backend  # type: ignore[assignment]
    try:
        affinity.set_mempolicy(Mpol.PREFERRED, [0])
        mode, nodes = affinity.get_mempolicy()
        affinity.set_mempolicy(Mpol.DEFAULT)
        return mode, nodes
    finally:
        affinity.mempolicy_backend = old  # type: ignore[assignment]


@pytest.mark.slow
def test_unknown_architecture_falls_back_to_libnuma() -> None:
    if not ctypes.util.find_library("numa"):
        pytest.skip("libnuma is not installed here")
    backend = _Mempolicy("hypothetical64")
    assert backend.numbers is None and backend.libnuma is not None and not backend.reason
    assert _roundtrip(backend) == (Mpol.PREFERRED, (0,))
    assert _roundtrip(affinity.mempolicy_backend()) == (Mpol.PREFERRED, (0,))  # same answer by syscall


def test_neither_says_so_once_and_leaves_cpu_binding(caplog: pytest.LogCaptureFixture) -> None:
    backend = _Mempolicy("hypothetical64", find_library=lambda name: None)
    assert backend.numbers is None and backend.libnuma is None
    assert "hypothetical64" in backend.reason and "CPU binding only" in backend.reason
    old = affinity.mempolicy_backend
    affinity.mempolicy_backend = lambda: backend  # type: ignore[assignment]
    try:
        with caplog.at_level(logging.WARNING, logger="numarun.worker.affinity"):
            for _ in range(3):
                with pytest.raises(OSError) as e:
                    affinity.set_mempolicy(Mpol.BIND, [0])
                assert e.value.errno == errno.ENOSYS and "CPU binding only" in str(e.value)
        assert sum("memory binding unavailable" in r.message for r in caplog.records) == 1
    finally:
        affinity.mempolicy_backend = old  # type: ignore[assignment]
