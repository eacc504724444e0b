"""Docker-like OCI containers for tests: Debian's ``crun`` runs a command over this host's own root
file system (a bind mount of ``/``; no image, no registry), as ``docker run`` would by default.

What makes it Docker-like (each a field of :class:`Spec`): Docker's default capability set, Docker's
seccomp rules for the NUMA memory-policy syscalls (EPERM without CAP_SYS_NICE) and for reading another
process's memory (EPERM without CAP_SYS_PTRACE), a 64 MiB ``/dev/shm``,
memlock 64 KiB, its own PID, IPC, UTS and mount namespaces (the host's network, as ``--network
host``), an optional cpuset, a read-only root, an unknown UID. The command is the container's PID 1.
``container=docker`` stands for Docker's ``/.dockerenv``, which a shared root cannot be given.

Root only (crun needs it to make namespaces and cgroups): :func:`crun_or_skip` skips elsewhere with
the reason; ``NUMARUN_TEST_CRUN=1`` (``scripts/test.sh`` as root) turns a missing crun into a failure.
A machine whose cgroups are hybrid, with a controller only in the v2 mount (hugetlb here), is
refused by crun until that controller is mounted as v1 too: :class:`Crun` does it once.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from helpers import REPO, TIMEOUT

DOCKER_CAPS = (
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
)
"""moby's oci/caps/defaults.go."""
MEMPOLICY_SYSCALLS = ("get_mempolicy", "mbind", "set_mempolicy", "migrate_pages", "move_pages")
"""Allowed by Docker's and containerd's default seccomp profiles only with CAP_SYS_NICE."""
PTRACE_SYSCALLS = ("kcmp", "pidfd_getfd", "process_madvise", "process_vm_readv", "process_vm_writev")
"""Allowed by Docker's default seccomp profile only with CAP_SYS_PTRACE (which is not in its default set): a
debugger such as py-spy cannot read another process's memory."""


@dataclass(frozen=True)
class Spec:
    """One container, by default as ``docker run`` makes it."""

    cpus: str | None = None
    """The cpuset (``linux.resources.cpu.cpus``); None: the host's."""
    shm: str = "64m"
    memlock: int = 64 << 10
    add_caps: tuple[str, ...] = ()
    """Beyond Docker's set, as ``--cap-add`` (``CAP_SYS_NICE`` also lifts the seccomp rule, as Docker's profile
    does)."""
    uid: int = 0
    """Not 0: an unknown UID, with no capabilities and no HOME."""
    readonly: bool = False
    writable: tuple[Path, ...] = ()
    """Host directories bound read-write at the same path (over a read-only root too)."""
    hostname: str = "numarun-ctr"
    resolvable: bool = True
    """Whether the container's /etc/hosts names ``hostname``."""
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: Path = REPO
    ptrace: bool = True
    """False: the ptrace syscall refused too, as by a pod's restricted seccomp profile (Docker's allows it)."""


class Crun:
    """Runs containers; the root bind mount is made once, each run writes only its config."""

    def __init__(self) -> None:
        self.base = Path(tempfile.mkdtemp(prefix="numarun-crun-"))
        self.rootfs = self.base / "rootfs"
        self.rootfs.mkdir()
        _mount_hybrid_controllers()
        subprocess.run(["mount", "--bind", "/", str(self.rootfs)], check=True)
        subprocess.run(["crun", "spec"], cwd=self.base, check=True)
        self.template = json.loads((self.base / "config.json").read_text())
        self._ids = itertools.count()

    def close(self) -> None:
        subprocess.run(["umount", "-l", str(self.rootfs)], check=False)
        shutil.rmtree(self.base, ignore_errors=True)

    def config(self, argv: Sequence[str], spec: Spec, bundle: Path) -> dict:
        cfg = json.loads(json.dumps(self.template))
        caps = sorted({*DOCKER_CAPS, *spec.add_caps})
        path = f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
        env = {
            "PATH": path,
            "LANG": "C.UTF-8",
            "container": "docker",
            **({"HOME": "/root"} if spec.uid == 0 else {}),
            **spec.env,
        }
        nofile = _hard_nofile()  # crun's default asks for more than some machines allow
        cfg["process"].update(
            terminal=False,
            args=list(argv),
            cwd=str(spec.cwd),
            user={"uid": spec.uid, "gid": spec.uid},
            env=[f"{k}={v}" for k, v in env.items()],
            rlimits=[
                {"type": "RLIMIT_NOFILE", "hard": nofile, "soft": nofile},
                {"type": "RLIMIT_MEMLOCK", "hard": spec.memlock, "soft": spec.memlock},
            ],
            capabilities={
                "bounding": caps,
                "effective": [] if spec.uid else caps,
                "permitted": [] if spec.uid else caps,
                "inheritable": [],
                "ambient": [],
            },
        )
        cfg["root"] = {"path": str(self.rootfs), "readonly": spec.readonly}
        cfg["hostname"] = spec.hostname
        for m in cfg["mounts"]:
            if m["destination"] == "/dev/shm":
                m["options"] = [o for o in m["options"] if not o.startswith("size=")] + [f"size={spec.shm}"]
        hosts = bundle / "hosts"
        hosts.write_text("127.0.0.1 localhost\n" + (f"127.0.0.1 {spec.hostname}\n" if spec.resolvable else ""))
        cfg["mounts"] += [
            {"destination": "/etc/hosts", "type": "bind", "source": str(hosts), "options": ["bind", "ro"]}
        ]
        cfg["mounts"] += [
            {"destination": str(d), "type": "bind", "source": str(d), "options": ["rbind", "rw"]} for d in spec.writable
        ]
        if spec.uid:
            cfg["mounts"] += _reachable(Path(sys.base_prefix).resolve())
        linux = cfg["linux"]
        linux["namespaces"] = [{"type": t} for t in ("pid", "ipc", "uts", "mount")]
        linux["resources"] = {
            "devices": [{"allow": False, "access": "rwm"}],
            **({"cpu": {"cpus": spec.cpus}} if spec.cpus else {}),
        }
        denied = [
            *(MEMPOLICY_SYSCALLS if "CAP_SYS_NICE" not in caps else ()),
            *(PTRACE_SYSCALLS if "CAP_SYS_PTRACE" not in caps else ()),
            *(() if spec.ptrace else ("ptrace",)),
        ]
        if denied:
            linux["seccomp"] = {
                "defaultAction": "SCMP_ACT_ALLOW",
                "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_AARCH64"],
                "syscalls": [{"names": denied, "action": "SCMP_ACT_ERRNO", "errnoRet": 1}],
            }
        return cfg

    def run(
        self, argv: Sequence[str], spec: Spec = Spec(), *, timeout: float = TIMEOUT
    ) -> subprocess.CompletedProcess[str]:
        """``argv`` in a container made by ``spec``, to its end, output captured; its exit status is the command's."""
        bundle = self.base / f"run{next(self._ids)}"
        bundle.mkdir()
        (bundle / "config.json").write_text(json.dumps(self.config(argv, spec, bundle)))
        name = f"numarun-{os.getpid()}-{bundle.name}"
        try:
            return subprocess.run(
                ["crun", "run", "-b", str(bundle), name],
                capture_output=True,
                text=True,
                timeout=timeout,
                stdin=subprocess.DEVNULL,
            )
        finally:
            subprocess.run(["crun", "delete", "--force", name], capture_output=True, check=False)


def _hard_nofile() -> int:
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    return 1 << 20 if hard == resource.RLIM_INFINITY else hard


def _mount_hybrid_controllers() -> None:
    unified = Path("/sys/fs/cgroup/unified/cgroup.controllers")
    if not unified.exists():
        return
    for name in unified.read_text().split():
        target = Path("/sys/fs/cgroup") / name
        if subprocess.run(["mountpoint", "-q", str(target)], check=False).returncode != 0:
            target.mkdir(exist_ok=True)
            subprocess.run(["mount", "-t", "cgroup", "-o", name, "cgroup", str(target)], check=True)


def _reachable(path: Path) -> list[dict]:
    """Mounts that let any UID reach ``path`` (the interpreter) below a directory only its owner may enter
    (a Python under /root): a tmpfs over that directory, and ``path``'s branch bound back into it."""
    for parent in reversed(path.parents):
        if parent != Path("/") and not parent.stat().st_mode & stat.S_IXOTH:
            branch = parent / path.relative_to(parent).parts[0]
            return [
                {"destination": str(parent), "type": "tmpfs", "source": "tmpfs", "options": ["mode=755"]},
                {"destination": str(branch), "type": "bind", "source": str(branch), "options": ["rbind", "ro"]},
            ]
    return []


def crun_or_skip() -> Crun:
    """A :class:`Crun`, or the test skipped with the reason (failed under ``NUMARUN_TEST_CRUN=1``)."""
    why = (
        "not Linux"
        if not sys.platform.startswith("linux")
        else "needs root"
        if os.geteuid() != 0
        else "crun is not installed (apt-get install crun)"
        if shutil.which("crun") is None
        else ""
    )
    if why:
        if os.environ.get("NUMARUN_TEST_CRUN") == "1":
            pytest.fail(f"NUMARUN_TEST_CRUN=1 but the container tests cannot run: {why}")
        pytest.skip(f"container tests: {why}")
    return Crun()
