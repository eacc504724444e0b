"""Finding the job numarun is part of (numarun.jobenv): Slurm steps and MPI launchers, read from the
variables they set (recorded from Slurm 22.05's srun, Open MPI 4.1's mpirun and MPICH 4.0's mpiexec),
and reconciled with the user's options. Pure: no process is started."""

import dataclasses

import pytest
from schedulers import slurm_env

from numarun.argtypes import NodeRange
from numarun.errors import JobConflict, NumarunError, SlurmError, UsageError
from numarun.jobenv import Mode, Scheduler, detect, scheduler_in
from numarun.jobenv.settle import check_rank, rank_env, rank_master, settle_node
from numarun.jobenv.slurm import parse_node_addrs, parse_tasks_per_node, rendezvous_port
from numarun.options.launch import DECLARED, from_environ, given

PER_RANK = {o.dest for o in DECLARED if o.per_rank}


def in_job(environ: dict[str, str]) -> dict:
    """What the options model states from a job's environment (``MASTER_ADDR``/``MASTER_PORT``, ``PET_*``)."""
    return from_environ(("master_addr", "master_port"), environ).with_job_env(environ).stated()


# ----------------------------------------------------------------------------- Slurm


def test_one_task_per_node_is_per_node_mode():
    job = detect(slurm_env(1))
    assert job.scheduler is Scheduler.SLURM and job.mode is Mode.PER_NODE
    assert (job.nnodes, job.node_index, job.node_name, job.job) == (2, 1, "node3", "1234.0")
    assert job.describe() == "Slurm step 1234.0: node 1 of 2, 1 task on this node: per-node mode"


def test_several_tasks_per_node_is_per_rank_mode():
    job = detect(slurm_env(1, per_node=2, local=1))
    assert job.mode is Mode.PER_RANK
    assert (job.rank, job.local_rank, job.world_size, job.local_world_size, job.node_index) == (3, 1, 4, 2, 1)
    assert job.describe().startswith("Slurm step 1234.0: node 1 of 2, 2 tasks on this node: per-rank mode")


def test_a_step_with_one_node_holding_two_tasks_is_per_rank_on_every_node():
    # srun -N2 -n3: 2 tasks on node1, 1 on node3; the node with one task must agree with the others
    env = slurm_env(1, SLURM_STEP_TASKS_PER_NODE="2,1", SLURM_STEP_NUM_TASKS="3", SLURM_NTASKS="3", SLURM_PROCID="2")
    job = detect(env)
    assert job.mode is Mode.PER_RANK and job.local_world_size == 1 and job.world_size == 3


def test_no_step_is_no_job():
    # an salloc shell, or the batch script itself: SLURM_JOB_ID without SLURM_STEP_ID
    env = slurm_env(0)
    del env["SLURM_STEP_ID"], env["SLURM_STEPID"]
    assert detect(env) is None
    assert detect({}) is None


def test_detection_can_be_turned_off():
    def detect_option(environ: dict[str, str]) -> bool:
        return from_environ(("detect",), environ).detect

    assert (
        detect_option({})
        and not detect_option({"NUMARUN_DETECT": "0"})
        and not detect_option({"NUMARUN_DETECT": "off"})
    )


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"SLURM_NODEID": "abc"}, "SLURM_NODEID 'abc'"),
        ({"SLURM_NODEID": "2"}, "SLURM_NODEID '2'"),
        ({"SLURM_STEP_NODELIST": "node[1-"}, "SLURM_STEP_NODELIST 'node[1-'"),
        ({"SLURM_LOCALID": "5"}, "SLURM_LOCALID '5'"),
        ({"SLURM_PROCID": "-1"}, "SLURM_PROCID '-1'"),
        ({"SLURM_STEP_TASKS_PER_NODE": "2(x"}, "SLURM_STEP_TASKS_PER_NODE '2(x'"),
        ({"SLURM_STEP_TASKS_PER_NODE": "1(x3)"}, "one count per node"),
        ({"SLURMD_NODENAME": "node9"}, "SLURMD_NODENAME 'node9'"),
        ({"SLURM_STEP_NUM_NODES": "5"}, "SLURM_STEP_NUM_NODES '5'"),
        ({"SLURM_STEP_ID": "x", "SLURM_STEPID": "x"}, "SLURM_STEP_ID 'x'"),
    ],
)
def test_malformed_slurm_environment_is_one_line(change, named):
    with pytest.raises(SlurmError) as e:
        detect(slurm_env(1, **change))
    text = str(e.value)
    assert named in text and "\n" not in text and "NUMARUN_DETECT=0" in text and e.value.exit_code == 2


def test_tasks_per_node_counts():
    assert parse_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert parse_tasks_per_node("8") == [8]
    for bad in ("", "0", "2(x0)", "a", "2(x99999999)"):
        with pytest.raises(SlurmError):
            parse_tasks_per_node(bad)


def test_gpu_ids_are_read_as_minor_numbers():
    job = detect(slurm_env(0, SLURM_JOB_GPUS="0,1", SLURM_STEP_GPUS="1", SLURM_GPUS_ON_NODE="2"))
    assert job.job_gpus == (0, 1) and job.step_gpus == (1,) and job.gpus_on_node == 2
    assert detect(slurm_env(0, SLURM_STEP_GPUS="gpu:a100")).step_gpus is None


def test_ports_differ_between_steps_of_a_job_and_neighbouring_jobs():
    ports = {rendezvous_port(1234, s) for s in range(32)}
    assert len(ports) == 32 and all(15000 <= p < 30000 and p % 2 == 0 for p in ports)
    assert rendezvous_port(1234, 0) != rendezvous_port(1235, 0)
    assert all(15000 <= rendezvous_port(j, s) < 30000 for j in (0, 1, 14999, 10**9 + 7) for s in (0, 5, 99))


def test_node_addrs_from_one_scontrol_call():
    text = (
        "NodeName=node1 Arch=x86_64 CoresPerSocket=1 NodeAddr=10.231.0.9 NodeHostName=vm\n"
        "NodeName=node3 Arch=x86_64 CoresPerSocket=1 NodeAddr=10.230.0.9 NodeHostName=vm\n"
    )
    assert parse_node_addrs(text) == {"node1": "10.231.0.9", "node3": "10.230.0.9"}
    multi = "NodeName=node2 Arch=x86_64\n   NodeAddr=10.231.0.10 NodeHostName=vm\n"
    assert parse_node_addrs(multi) == {"node2": "10.231.0.10"} and parse_node_addrs("") == {}


# ----------------------------------------------------------------------------- per-node settle

LEAF = {"node1": "s1", "node3": "s1", "node2": "s2", "node4": "s2"}


def four(node: int, **extra):
    return slurm_env(node, nodes="node[1-4]", names=("node1", "node2", "node3", "node4"), **extra)


def test_settle_fills_the_rendezvous_from_the_step():
    job = detect(four(1))
    rdv = settle_node(job, given().stated(), leaf_switch=LEAF)
    # node2 sits under switch s2, after node1 and node3 of s1
    assert rdv.order == ("node1", "node3", "node2", "node4") and rdv.node_rank == 2 and rdv.head == "node1"
    opts = rdv.options("10.231.0.9")
    assert opts == {
        "nnodes": NodeRange.of(4),
        "node_rank": 2,
        "rdzv_backend": "static",
        "master_addr": "10.231.0.9",
        "master_port": rendezvous_port(1234, 0),
        "rdzv_endpoint": "",
    }


def test_an_explicit_node_rank_that_agrees_keeps_slurms_order():
    rdv = settle_node(detect(four(1)), given(node_rank=1, nnodes=NodeRange.of(4)).stated(), leaf_switch=LEAF)
    assert rdv.node_rank == 1 and rdv.order == ("node1", "node2", "node3", "node4")


def test_explicit_options_that_agree_are_used_as_given():
    stated = given(nnodes=NodeRange.of(2), node_rank=1, master_addr="head.example", master_port=29555).stated()
    rdv = settle_node(detect(slurm_env(1)), stated)
    assert rdv.options() == {
        "nnodes": NodeRange.of(2),
        "node_rank": 1,
        "rdzv_backend": "static",
        "master_addr": "head.example",
        "master_port": 29555,
        "rdzv_endpoint": "",
    }


def test_master_addr_and_port_from_the_environment_count_as_given():
    rdv = settle_node(detect(slurm_env(0)), in_job({"MASTER_ADDR": "h0", "MASTER_PORT": "23456"}))
    assert rdv.master_addr == "h0" and rdv.master_port == 23456
    with pytest.raises(UsageError, match="bad MASTER_PORT 'x': expected a whole number from 1 to 65535"):
        in_job({"MASTER_PORT": "x"})


def test_the_users_own_c10d_rendezvous_is_kept_with_the_steps_node_count():
    rdv = settle_node(detect(slurm_env(1)), given(rdzv_backend="c10d", rdzv_endpoint="h:29400").stated())
    assert rdv.own_rendezvous and rdv.options() == {"nnodes": NodeRange.of(2)}
    # an elastic range holding the step's node count agrees
    assert settle_node(detect(slurm_env(1)), given(nnodes=NodeRange(1, 4), rdzv_backend="c10d").stated()).own_rendezvous


def test_early_expanded_node_rank_is_refused_on_the_node_that_can_tell():
    stated = given(
        nnodes=NodeRange.of(2), node_rank=0
    ).stated()  # the batch shell expanded $SLURM_NODEID to 0 for every node
    settle_node(detect(slurm_env(0)), stated)  # node 0 sees nothing wrong
    with pytest.raises(JobConflict) as e:
        settle_node(detect(slurm_env(1)), stated)
    text = str(e.value)
    assert e.value.node_varying and "--node-rank 0" in text and "SLURM_NODEID 1" in text and "node3" in text
    assert "expanded by the batch shell before srun" in text and "\n" not in text


@pytest.mark.parametrize(
    ("stated", "named"),
    [
        (given(nnodes=NodeRange.of(3)).stated(), "bad --nnodes '3': Slurm step 1234.0 runs on 2 nodes"),
        (given(nnodes=NodeRange(3, 4)).stated(), "bad --nnodes '3:4'"),
        (given(standalone=True).stated(), "bad option '--standalone': Slurm step 1234.0 spans 2 nodes"),
    ],
)
def test_options_contradicting_the_step_are_one_line(stated, named):
    with pytest.raises(JobConflict) as e:
        settle_node(detect(slurm_env(0)), stated)
    assert named in str(e.value) and not e.value.node_varying and e.value.exit_code == 2


# ----------------------------------------------------------------------------- per-rank


def test_rank_env_is_what_torchrun_gives_its_workers():
    job = detect(slurm_env(1, per_node=2, local=1))
    env = rank_env(job, master_addr="10.0.0.1", master_port=15000, environ={})
    assert {
        k: env[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE")
    } == {
        "RANK": "3",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "4",
        "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "1",
        "GROUP_WORLD_SIZE": "2",
    }
    assert env["MASTER_ADDR"] == "10.0.0.1" and env["MASTER_PORT"] == "15000"
    assert env["TORCHELASTIC_RUN_ID"] == "1234.0" and env["TORCHELASTIC_USE_AGENT_STORE"] == "False"
    assert env["ROLE_RANK"] == "3" and env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"


def test_rank_master_is_the_steps_port_and_the_head_to_look_up():
    job = detect(slurm_env(1, per_node=2, local=0))
    assert rank_master(job, given().stated()) == (None, rendezvous_port(1234, 0))
    assert rank_master(job, given(master_addr="a", master_port=1).stated()) == ("a", 1)
    assert rank_master(job, in_job({"MASTER_ADDR": "b", "MASTER_PORT": "7"})) == ("b", 7)
    assert rank_master(job, in_job({"MASTER_ADDR": "b", "PET_MASTER_ADDR": "c"})) == ("c", rendezvous_port(1234, 0))


@pytest.mark.parametrize(
    ("stated", "named", "varying"),
    [
        (given(nproc_per_node=2).stated(), "bad --nproc-per-node 2: Slurm step 1234.0 already starts 2 tasks", False),
        (given(nnodes=NodeRange.of(1)).stated(), "bad --nnodes '1'", False),
        (given(node_rank=0).stated(), "bad --node-rank 0", True),
        (given(max_restarts=3).stated(), "bad option '--max-restarts': in per-rank mode", False),
    ],
)
def test_per_rank_refuses_what_contradicts_the_step(stated, named, varying):
    with pytest.raises(JobConflict) as e:
        check_rank(detect(slurm_env(1, per_node=2, local=1)), stated, per_rank=PER_RANK)
    assert named in str(e.value) and e.value.node_varying is varying


def test_per_rank_accepts_agreeing_options():
    agreeing = given(nproc_per_node=1, nnodes=NodeRange.of(2), node_rank=1).stated()
    check_rank(detect(slurm_env(1, per_node=2, local=1)), agreeing, per_rank=PER_RANK)


# ----------------------------------------------------------------------------- MPI

OMPI = {
    "OMPI_COMM_WORLD_RANK": "1",
    "OMPI_COMM_WORLD_SIZE": "2",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    "OMPI_COMM_WORLD_NODE_RANK": "1",
    "PMIX_RANK": "1",
    "PMIX_NAMESPACE": "1923284993",
}
MPICH = {"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2", "PMI_FD": "8"}


def test_open_mpi_ranks_are_per_rank():
    job = detect(OMPI)
    assert job.scheduler is Scheduler.OPENMPI and job.mode is Mode.PER_RANK
    assert (job.rank, job.world_size, job.local_rank, job.local_world_size, job.nnodes) == (1, 2, 1, 2, 1)
    assert rank_master(job, given().stated()) == ("127.0.0.1", 29500)


def test_mpich_and_intel_mpi_ranks_are_per_rank():
    job = detect(MPICH)
    assert job.scheduler is Scheduler.MPICH and (job.rank, job.world_size, job.local_world_size) == (1, 2, 2)


def test_pmix_alone_needs_the_size_from_the_environment():
    job = detect({"PMIX_RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"})
    assert job.scheduler is Scheduler.PMIX and (job.rank, job.node_index, job.nnodes) == (3, -1, 0)  # the ranks agree
    with pytest.raises(UsageError, match="WORLD_SIZE None"):
        detect({"PMIX_RANK": "0"})


def test_several_mpi_nodes_need_an_address():
    env = {**OMPI, "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "3"}
    job = detect(env)
    assert job.nnodes == 0 and job.node_index == -1  # told by the ranks' exchange, before the script
    with pytest.raises(UsageError, match="expected --master-addr HOST or MASTER_ADDR"):
        rank_master(job, given().stated())
    assert rank_master(job, in_job({"MASTER_ADDR": "n0"})) == ("n0", 29500)


def test_one_mpi_process_per_node_with_nproc_per_node_is_per_node_mode():
    env = {
        "OMPI_COMM_WORLD_RANK": "1",
        "OMPI_COMM_WORLD_SIZE": "2",
        "OMPI_COMM_WORLD_LOCAL_RANK": "0",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "1",
    }
    assert detect(env).mode is Mode.PER_RANK
    job = detect(env, nproc_given=True)
    assert job.mode is Mode.PER_NODE and job.nnodes == 2
    rdv = settle_node(job, {**given(nproc_per_node=4).stated(), **in_job({"MASTER_ADDR": "n0"})})
    assert rdv.options()["node_rank"] == 1 and rdv.options()["master_addr"] == "n0"


@pytest.mark.parametrize(
    "change", [{"OMPI_COMM_WORLD_RANK": "2"}, {"OMPI_COMM_WORLD_LOCAL_RANK": "x"}, {"OMPI_COMM_WORLD_SIZE": "0"}]
)
def test_malformed_mpi_environment_is_one_line(change):
    with pytest.raises(NumarunError) as e:
        detect({**OMPI, **change})
    assert "bad openmpi environment: OMPI_COMM_WORLD_" in str(e.value) and "\n" not in str(e.value)


def test_mpi_ranks_on_several_nodes_leave_the_node_to_the_ranks():
    """MPI does not say which node a rank is on: any mapping (--map-by node), any uneven nodes, is
    taken, and the node index and count come from the ranks' exchange (numarun.launch.rank.agree)."""
    env = {**OMPI, "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_LOCAL_RANK": "0"}
    job = detect(env)
    assert (job.node_index, job.nnodes) == (-1, 0) and "several nodes, 2 tasks on this node" in job.describe()
    check_rank(
        job, given(nnodes=NodeRange.of(3), node_rank=5).stated(), per_rank=PER_RANK
    )  # not refused before the ranks agree...
    with pytest.raises(JobConflict, match="bad --nnodes '3'"):  # ...and checked once they have
        check_rank(
            dataclasses.replace(job, nnodes=2, node_index=1), given(nnodes=NodeRange.of(3)).stated(), per_rank=PER_RANK
        )
    uneven = detect(
        {**env, "OMPI_COMM_WORLD_SIZE": "3", "OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "1"}
    )
    assert (uneven.rank, uneven.node_index, uneven.nnodes) == (2, -1, 0)
    one_node = detect({**env, "OMPI_COMM_WORLD_SIZE": "2"})
    assert (one_node.node_index, one_node.nnodes) == (0, 1)


def test_mpirun_inside_a_slurm_allocation_is_mpi_not_the_daemons_step():
    # mpirun starts its daemons with srun: the ranks carry the daemons' step (one task per node)
    env = {**slurm_env(0), **OMPI}
    assert scheduler_in(env) is Scheduler.OPENMPI
    # srun --mpi=pmi2 starts the ranks itself: PMI and Slurm describe the same tasks
    same = {**slurm_env(1, per_node=2, local=1), "PMI_RANK": "3", "PMI_SIZE": "4"}
    assert scheduler_in(same) is Scheduler.SLURM
    # mpiexec.hydra under Slurm: its proxies are the step's tasks, the ranks are PMI's
    hydra = {**slurm_env(1), "PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}
    assert scheduler_in(hydra) is Scheduler.MPICH
