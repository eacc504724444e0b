"""Which container runtime this process runs in, from the markers each runtime documents, and each
fix numarun names in that runtime's own words. Reads only files under ``root`` (a recorded tree
stands for ``/``); the rest is pure."""

from __future__ import annotations

import collections
import enum
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path


class Runtime(str, enum.Enum):
    """A container runtime, by the name its users know; its markers are in docs/containers.md."""

    KUBERNETES = "kubernetes"
    APPTAINER = "apptainer"
    ENROOT = "enroot"
    PODMAN = "podman"
    DOCKER = "docker"
    OTHER = "container"


@dataclass(frozen=True)
class Container:
    runtime: Runtime
    markers: tuple[str, ...]  # what was found, e.g. ('/.dockerenv',)

    def describe(self) -> str:  # docker (/.dockerenv)
        return f"{self.runtime.value} ({', '.join(self.markers)})"


# substrings of /proc/1/cgroup or /proc/self/mountinfo that only a container's processes see
_CGROUP_HINTS = (
    ("kubepods", Runtime.KUBERNETES),
    ("/pyxis_", Runtime.ENROOT),
    ("libpod", Runtime.PODMAN),
    ("/docker/", Runtime.DOCKER),
    ("docker-", Runtime.DOCKER),
    ("containerd", Runtime.OTHER),
    ("/lxc/", Runtime.OTHER),
)


def _exists(root: Path, path: str) -> bool:
    try:
        return (root / path.lstrip("/")).exists()
    except OSError:
        return False


def _text(root: Path, path: str) -> str:
    try:
        with open(root / path.lstrip("/"), "rb") as f:
            return f.read(1 << 20).decode("utf-8", "replace")
    except OSError:
        return ""


def detect_container(environ: Mapping[str, str], root: Path = Path("/")) -> Container | None:
    """The runtime this process runs in, most specific first (a pod is a pod whatever its engine); None when no
    marker says it runs in one."""
    found: dict[Runtime, list[str]] = collections.defaultdict(list)  # each runtime's markers, as found
    if "KUBERNETES_SERVICE_HOST" in environ:
        found[Runtime.KUBERNETES].append("KUBERNETES_SERVICE_HOST")
    for key in sorted(environ):
        if key.startswith(("APPTAINER_", "SINGULARITY_")) and key.endswith(("_CONTAINER", "_NAME")):
            found[Runtime.APPTAINER].append(key)
        elif key.startswith(("ENROOT_", "PYXIS_")):
            found[Runtime.ENROOT].append(key)
    for path, runtime in (
        ("/var/run/secrets/kubernetes.io", Runtime.KUBERNETES),
        ("/.singularity.d", Runtime.APPTAINER),
        ("/.lock", Runtime.ENROOT),
        ("/.enroot", Runtime.ENROOT),
        ("/run/.containerenv", Runtime.PODMAN),
        ("/.dockerenv", Runtime.DOCKER),
    ):
        if _exists(root, path):
            found[runtime].append(path)
    value = environ.get("container", "")
    if value:
        named = {r.value: r for r in Runtime}.get(value, Runtime.OTHER)
        found[named].append(f"container={value}")
    if not found:
        hints = _text(root, "/proc/1/cgroup") + _text(root, "/proc/self/mountinfo")
        for needle, runtime in _CGROUP_HINTS:
            if needle in hints:
                found[runtime].append(f"cgroup/mount '{needle}'")
                break
    for runtime in Runtime:
        if runtime in found:
            return Container(runtime, tuple(dict.fromkeys(found[runtime])))
    return None


class Fix(str, enum.Enum):
    """A confinement numarun names, with its fix per runtime (:func:`fix`)."""

    MEMPOLICY = "mempolicy"
    SHM = "shm"
    MEMLOCK = "memlock"
    GPUS = "gpus"
    INIT = "init"


_FIXES: dict[Fix, dict[Runtime | None, str]] = {
    Fix.MEMPOLICY: {
        Runtime.DOCKER: "docker run --cap-add SYS_NICE",
        Runtime.PODMAN: "podman run --cap-add SYS_NICE",
        Runtime.KUBERNETES: 'the container\'s securityContext.capabilities.add: ["SYS_NICE"]',
        Runtime.APPTAINER: (
            "apptainer exec --add-caps CAP_SYS_NICE (an administrator grants it with 'apptainer capability add')"
        ),
        None: "give the container CAP_SYS_NICE, or a seccomp profile that allows set_mempolicy and mbind",
    },
    Fix.SHM: {
        Runtime.DOCKER: "docker run --ipc=host, or --shm-size={size}",
        Runtime.PODMAN: "podman run --ipc=host, or --shm-size={size}",
        Runtime.KUBERNETES: "an emptyDir volume with medium: Memory (sizeLimit: {size}) mounted at /dev/shm",
        Runtime.ENROOT: "the host's /dev/shm: leave out srun --container-unshare=ipc (and ENROOT_UNSHARE_IPC)",
        None: "a tmpfs of at least {size} at /dev/shm, or the host's /dev/shm",
    },
    Fix.MEMLOCK: {
        Runtime.DOCKER: "docker run --ulimit memlock=-1",
        Runtime.PODMAN: "podman run --ulimit memlock=-1",
        Runtime.KUBERNETES: (
            "LimitMEMLOCK=infinity for the node's container runtime (containerd's systemd unit); pods inherit it"
        ),
        None: "raise the limit where the container is started (ulimit -l unlimited; Slurm: PropagateResourceLimits)",
    },
    Fix.GPUS: {
        Runtime.DOCKER: "docker run --gpus all (or --gpus '\"device=0,1\"')",
        Runtime.PODMAN: "podman run --device nvidia.com/gpu=all",
        Runtime.KUBERNETES: "resources.limits: nvidia.com/gpu: N in the container spec",
        Runtime.ENROOT: "srun --gpus-per-node=N (pyxis passes the job's GPUs to enroot)",
        Runtime.APPTAINER: "apptainer exec --nv",
        None: "give the container the GPUs' /dev/nvidiaN device files",
    },
    Fix.INIT: {
        Runtime.DOCKER: "docker run --init",
        Runtime.PODMAN: "podman run --init",
        Runtime.KUBERNETES: "shareProcessNamespace: true in the pod spec (the pause process is then PID 1)",
        None: "start it under an init such as tini",
    },
}


def fix(what: Fix, runtime: Runtime | str | None, **values: str) -> str:
    """The fix for ``what`` in the words of ``runtime`` (a general one for others and for None)."""
    table = _FIXES[what]
    text = table.get(Runtime(runtime) if runtime else None) or table[None]
    return text.format(**values)
