"""Knowing the container and what it confines, without starting one: the runtime from its markers
(environment and files under a fake root), the GPUs a container may open on a constructed 8-GPU
tree, a plan whose memory policy the kernel refuses, ``--strict-binding`` there, the doctor's
container checks, the memory-policy probe on this machine. The real containers are in
tests/e2e/test_containers.py."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path

import pytest
from trees import FIXTURES, extract_tree

from numarun.cli import main as cli_main
from numarun.commands.run import refuse_unbound
from numarun.doctor.checks import check_cpus
from numarun.doctor.container import (
    DATALOADER_SHM_PER_RANK,
    NCCL_SHM_PER_PEER,
    Confinement,
    check_confinement,
    read_confinement,
    shm_needed,
)
from numarun.errors import BindingError
from numarun.jobenv.container import Container, Fix, Runtime, detect_container, fix
from numarun.launch.planning import container_at, here
from numarun.plan.binding import make_plan
from numarun.plan.model import LaunchPlan, MemPolicy, PlanRequest
from numarun.plan.scheduled import confine
from numarun.topology.discover import load_topology
from numarun.topology.model import Nic, NicKind, RdmaPort
from numarun.view.plan import render_plan
from numarun.worker import affinity


def _generator():
    spec = importlib.util.spec_from_file_location("make_tree", FIXTURES / "constructed" / "make_2gpu_minors_tree.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# 8 GPUs, minor N = GPU N in PCI order; GPUs 0-3 on NUMA node 0 (cpu0), 4-7 on node 1 (cpu1)
EIGHT = tuple(
    (f"0000:{0x18 + 0x10 * i:02x}:00.0", i // 4, i, f"GPU-{i:08x}-0000-0000-0000-000000000000") for i in range(8)
)


def _tree(root: Path, *, docker: bool, devices: tuple[int, ...]) -> Path:
    for name, text in _generator().files(EIGHT).items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    (root / "dev").mkdir()
    for m in devices:  # the test's stand-ins for /dev/nvidiaN: what the runtime gave the container
        (root / "dev" / f"nvidia{m}").write_text("")
    if docker:
        (root / ".dockerenv").write_text("")
    return root


@pytest.mark.parametrize(
    ("environ", "files", "runtime", "marker"),
    [
        ({}, [".dockerenv"], Runtime.DOCKER, "/.dockerenv"),
        ({"container": "podman"}, ["run/.containerenv"], Runtime.PODMAN, "/run/.containerenv"),
        ({"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, [".dockerenv"], Runtime.KUBERNETES, "KUBERNETES_SERVICE_HOST"),
        (
            {},
            ["var/run/secrets/kubernetes.io/serviceaccount/token"],
            Runtime.KUBERNETES,
            "/var/run/secrets/kubernetes.io",
        ),
        (
            {"APPTAINER_CONTAINER": "/img.sif", "APPTAINER_NAME": "img.sif"},
            [],
            Runtime.APPTAINER,
            "APPTAINER_CONTAINER",
        ),
        ({"SINGULARITY_CONTAINER": "/img.sif"}, [".singularity.d/runscript"], Runtime.APPTAINER, "/.singularity.d"),
        ({"SLURM_JOB_ID": "7"}, [".lock"], Runtime.ENROOT, "/.lock"),
        ({"ENROOT_ROOTFS": "/x"}, [], Runtime.ENROOT, "ENROOT_ROOTFS"),
        ({"container": "lxc"}, [], Runtime.OTHER, "container=lxc"),
    ],
)
def test_the_runtime_is_known_by_its_markers(tmp_path, environ, files, runtime, marker):
    for f in files:
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_text("")
    found = detect_container(environ, tmp_path)
    assert found is not None and found.runtime is runtime and marker in found.markers


def test_cgroup_and_mount_hints_name_a_runtime_without_markers(tmp_path):
    (tmp_path / "proc/1").mkdir(parents=True)
    (tmp_path / "proc/1/cgroup").write_text("0::/kubepods.slice/kubepods-besteffort.slice/cri-containerd-ab.scope\n")
    assert detect_container({}, tmp_path).runtime is Runtime.KUBERNETES
    (tmp_path / "proc/1/cgroup").write_text("0::/\n")
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/self/mountinfo").write_text("550 480 0:52 /enroot-data/user-1000/pyxis_12.0 / rw - overlay\n")
    assert detect_container({}, tmp_path).runtime is Runtime.ENROOT
    (tmp_path / "proc/self/mountinfo").write_text("22 1 8:1 / / rw - ext4 /dev/sda1 rw\n")
    assert detect_container({"HOME": "/root", "PATH": "/bin"}, tmp_path) is None


def test_each_fix_is_in_the_runtimes_own_words():
    assert fix(Fix.MEMPOLICY, Runtime.DOCKER) == "docker run --cap-add SYS_NICE"
    assert "securityContext.capabilities.add" in fix(Fix.MEMPOLICY, "kubernetes")
    assert "emptyDir" in fix(Fix.SHM, Runtime.KUBERNETES, size="2g") and "medium: Memory" in fix(
        Fix.SHM, "kubernetes", size="2g"
    )
    assert fix(Fix.SHM, Runtime.PODMAN, size="2g") == "podman run --ipc=host, or --shm-size=2g"
    assert fix(Fix.MEMLOCK, Runtime.DOCKER) == "docker run --ulimit memlock=-1"
    assert "--nv" in fix(Fix.GPUS, Runtime.APPTAINER) and "--gpus all" in fix(Fix.GPUS, Runtime.DOCKER)
    assert "CAP_SYS_NICE" in fix(Fix.MEMPOLICY, None) and "CAP_SYS_NICE" in fix(Fix.MEMPOLICY, Runtime.ENROOT)


def test_a_container_that_sees_8_gpus_and_may_open_2_plans_2_next_to_their_numa_nodes(tmp_path):
    root = _tree(tmp_path, docker=True, devices=(2, 5))
    topo = load_topology(str(root))
    assert len(topo.gpus) == 8 and [g.minor for g in topo.gpus] == list(range(8))
    node = here(topo, str(root), environ={})
    assert node.container.runtime is Runtime.DOCKER and node.gpu_minors == (2, 5)
    plan = make_plan(topo, PlanRequest(allowed_gpu_minors=node.gpu_minors))
    assert [(r.gpu.index, r.gpu.cuda_index, r.numa_node, r.cpus, r.mems) for r in plan.ranks] == [
        (2, 0, 0, (0,), (0,)),
        (5, 1, 1, (1,), (1,)),
    ]


def test_the_plan_command_plans_the_containers_gpus(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    root = _tree(tmp_path, docker=True, devices=(2, 5))
    assert cli_main(["plan", "--topology", str(root), "--json", "--no-detect"]) == 0
    plan = LaunchPlan.from_json(capsys.readouterr().out)
    assert plan.container == "docker" and [r.gpu.index for r in plan.ranks] == [2, 5]


def test_outside_a_container_an_absent_device_file_refuses_nothing(tmp_path):
    root = _tree(tmp_path, docker=False, devices=(2, 5))
    topo = load_topology(str(root))
    assert here(topo, str(root), environ={}).gpu_minors is None  # the driver's files alone decide nothing
    assert container_at(str(root), {}) is None


def test_a_container_given_no_gpu_plans_cpu_ranks(tmp_path):
    root = _tree(tmp_path, docker=True, devices=())
    topo = load_topology(str(root))
    node = here(topo, str(root), environ={})
    assert node.gpu_minors == ()
    assert [r.gpu for r in make_plan(topo, PlanRequest(allowed_gpu_minors=node.gpu_minors)).ranks] == [None]


@pytest.fixture(scope="module")
def two_node_plan() -> LaunchPlan:
    topo = load_topology(str(extract_tree(FIXTURES / "constructed" / "2gpu-minors-reversed.tar.gz")))
    return make_plan(topo, PlanRequest())


def test_a_refused_memory_policy_is_marked_in_the_plan_with_one_warning(two_node_plan):
    assert all(r.mems for r in two_node_plan.ranks)
    plan = confine(two_node_plan, Container(Runtime.DOCKER, ("/.dockerenv",)), "seccomp")
    assert plan.mem_unbound == "seccomp" and plan.container == "docker"
    assert all(r.mem_policy is MemPolicy.NONE and r.mems == () for r in plan.ranks)
    assert [r.cpus for r in plan.ranks] == [r.cpus for r in two_node_plan.ranks]  # CPUs stay bound
    (line,) = [w for w in plan.warnings if "seccomp" in w]
    assert line.startswith("memory not bound (seccomp): ") and "docker run --cap-add SYS_NICE" in line
    assert "--mem-policy none" in line
    title = " ".join(render_plan(plan, width=160).split("rank ")[0].split())  # a long title wraps over the table
    assert title == "gpu-minors in a docker container: 2 ranks, binding exclusive, memory not bound (seccomp)"
    again = LaunchPlan.from_json(plan.to_json())
    assert again.mem_unbound == "seccomp" and again.container == "docker"
    # an older plan file without the fields reads as bound, outside a container
    data = json.loads(two_node_plan.to_json())
    del data["mem_unbound"], data["container"]
    assert LaunchPlan.from_json(json.dumps(data)).mem_unbound == ""


def test_nothing_to_refuse_leaves_the_plan_as_it_was(two_node_plan):
    assert confine(two_node_plan, None, "") == two_node_plan
    unasked = make_plan(
        load_topology(str(extract_tree(FIXTURES / "constructed" / "2gpu-minors-reversed.tar.gz"))),
        PlanRequest(mem_policy=MemPolicy.NONE),
    )
    assert confine(unasked, None, "seccomp").warnings == unasked.warnings  # nothing asked, nothing refused


def test_strict_binding_refuses_an_unbound_plan_in_one_line(two_node_plan):
    refuse_unbound(two_node_plan, True)
    plan = confine(two_node_plan, Container(Runtime.KUBERNETES, ("KUBERNETES_SERVICE_HOST",)), "seccomp")
    refuse_unbound(plan, False)
    with pytest.raises(BindingError) as e:
        refuse_unbound(plan, True)
    text = str(e.value)
    assert e.value.exit_code == 2 and "\n" not in text
    assert text.startswith("--strict-binding, but the ranks' memory cannot be bound here (seccomp)")
    assert "securityContext.capabilities.add" in text


def test_the_probe_leaves_this_threads_policy_as_it_was():
    before = affinity.get_mempolicy()
    assert affinity.mempolicy_refusal() == ""  # this machine lets a process set its policy
    assert affinity.get_mempolicy() == before


def test_the_shm_rule():
    assert NCCL_SHM_PER_PEER == 2 * (4 * 2**20 + 4_915_200 + 512 * 2**10)
    need, nccl = shm_needed(ranks=8, gpu_ranks=8)
    assert nccl == 56 * NCCL_SHM_PER_PEER and need == nccl + 8 * DATALOADER_SHM_PER_RANK
    assert shm_needed(ranks=2, gpu_ranks=0) == (2 * DATALOADER_SHM_PER_RANK, 0)


DOCKER = Container(Runtime.DOCKER, ("/.dockerenv",))


def _checks(topo, **confinement):
    return {f.check: f for f in check_confinement(topo, Confinement(**confinement), PlanRequest())}


def test_doctor_names_each_confinement_with_its_fix(tmp_path):
    topo = load_topology(str(_tree(tmp_path, docker=True, devices=(2, 5))))
    found = _checks(
        topo,
        container=DOCKER,
        mem_refused="seccomp",
        shm_bytes=32 << 20,
        memlock_bytes=64 << 10,
        gpu_access={m: (True if m in (2, 5) else None) for m in range(8)},
        cgroup="v2",
        cpuset=(0, 1),
        pid1=True,
    )
    assert found["container"].severity.value == "info" and "/.dockerenv" in found["container"].message
    assert found["mempolicy"].severity.value == "warn" and "docker run --cap-add SYS_NICE" in found["mempolicy"].message
    shm = found["shm"]  # 2 GPU ranks: NCCL's buffers alone (37 MiB) overflow 32 MiB
    assert shm.severity.value == "error" and "holds 32 MiB; 2 ranks need about 549 MiB" in shm.message
    assert "docker run --ipc=host, or --shm-size=1g" in shm.message
    assert found["memlock"].severity.value == "info" and "64 KiB" in found["memlock"].message
    assert "8 GPUs under /sys, 2 may be opened here (/dev/nvidia2,/dev/nvidia5)" in found["gpus"].message
    assert found["cgroup"].message == "cgroup v2, cpuset 0-1 (2 CPUs)"
    assert found["pid1"].severity.value == "info" and "docker run --init" in found["pid1"].message


def test_doctor_memlock_with_rdma_and_no_gpu_for_a_pod(tmp_path):
    topo = load_topology(str(_tree(tmp_path, docker=True, devices=())))
    ib = Nic("mlx5_0", kind=NicKind.INFINIBAND, ports=(RdmaPort(1, "ACTIVE", "InfiniBand"),))
    topo = dataclasses.replace(topo, nics=(ib,))
    pod = Container(Runtime.KUBERNETES, ("KUBERNETES_SERVICE_HOST",))
    found = _checks(topo, container=pod, memlock_bytes=8 << 20, shm_bytes=1 << 40, gpu_access=dict.fromkeys(range(8)))
    assert found["memlock"].severity.value == "error" and found["memlock"].device == "mlx5_0"
    assert "LimitMEMLOCK=infinity" in found["memlock"].message
    assert found["gpus"].severity.value == "warn" and "nvidia.com/gpu" in found["gpus"].message
    assert "shm" not in found and "mempolicy" not in found


def test_doctor_outside_a_container_with_no_limits_says_nothing(tmp_path):
    topo = load_topology(str(_tree(tmp_path, docker=False, devices=tuple(range(8)))))
    assert _checks(topo, shm_bytes=1 << 40, memlock_bytes=-1, gpu_access=dict.fromkeys(range(8), True)) == {}


def test_the_confinement_is_read_under_a_root(tmp_path):
    root = _tree(tmp_path, docker=True, devices=(2, 5))
    (root / "proc/self/mounts").write_text(
        "shm /dev/shm tmpfs rw,nosuid,nodev,noexec,relatime,size=65536k,inode64 0 0\n"
        "cgroup /sys/fs/cgroup/cpuset cgroup ro,cpuset 0 0\ncgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n"
    )
    (root / "proc/self/limits").write_text(
        "Limit                     Soft Limit           Hard Limit           Units\n"
        "Max locked memory         65536                65536                bytes\n"
    )
    topo = load_topology(str(root))
    c = read_confinement(root, {"KUBERNETES_SERVICE_HOST": "x"}, live=False, topo=topo)
    assert c.container.runtime is Runtime.DOCKER  # a recorded tree's environment is not this process's
    assert (c.shm_bytes, c.memlock_bytes, c.cgroup, c.mem_refused, c.pid1) == (64 << 20, 64 << 10, "hybrid", "", False)
    assert c.gpu_access == {0: None, 1: None, 2: True, 3: None, 4: None, 5: True, 6: None, 7: None}


def test_the_smt_state_is_said_in_words(two_node_plan):
    topo = load_topology(str(extract_tree(FIXTURES / "constructed" / "2gpu-minors-reversed.tar.gz")))
    (smt,) = [f for f in check_cpus(topo, PlanRequest(), "notsupported") if f.check == "smt"]
    assert smt.message == "SMT is not supported by this CPU"
    (smt,) = [f for f in check_cpus(topo, PlanRequest(), "on") if f.check == "smt"]
    assert smt.message == "SMT is on"


def test_topo_and_plan_headers_name_the_container(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    root = _tree(tmp_path, docker=True, devices=(2, 5))
    assert cli_main(["topo", "--topology", str(root), "--width", "200"]) == 0
    assert "container: docker (/.dockerenv)" in capsys.readouterr().out.splitlines()[0]
    assert cli_main(["plan", "--topology", str(root), "--no-detect"]) == 0
    assert capsys.readouterr().out.splitlines()[0].startswith("gpu-minors in a docker container: 2 ranks")
