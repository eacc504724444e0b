"""Bad input, table-driven: every case is refused with exit 2 and one line naming the value.

Each row is a real user mistake (CLI flags, Hydra overrides, topology files and trees,
``CUDA_VISIBLE_DEVICES``, impossible plans, run dirs, SLURM options). The whole table runs
in-process through ``numarun.cli.main`` (the same code the ``numarun`` entry point calls),
with the working directory a fresh empty folder that must stay empty: no run dir, no
checkpoint, no plan file. A few rows also run as real ``numarun`` subprocesses to prove
the end-to-end promise: exit 2, one stderr line, no traceback.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest
from helpers import FIXTURES, clean_env, numarun_cmd
from refusals import EXIT, TRAIN, Case, case, check_refusal, run_in_process, unwritable

FIX = FIXTURES
P4D = str(FIX / "nvidia-smi" / "aws-p4d.24xlarge.txt")  # 8 GPUs, no UUIDs
P4 = str(FIX / "nvidia-smi" / "tesla-p4-1gpu-numa-NA.txt")  # 1 GPU, 8 CPUs
NODE0 = "sys/devices/system/node/node0/cpulist"
LAYOUT2 = f"--topology {P4D} --nproc-per-node 2 {TRAIN} model=gpt trainer.batch_size=16 parallel=fsdp"
PLAN2 = f"plan --topology {P4D} --nproc-per-node 2"


# {bad}: a folder of broken inputs built by the `bad` fixture; {tree}: a sysfs tree.
CASES: list[Case] = [
    # --- numarun run flags
    case("nproc-zero", f"--nproc-per-node 0 {EXIT} 0 0", "'0'", "positive integer"),
    case("nproc-negative", f"--nproc-per-node -1 {EXIT} 0 0", "'-1'", "positive integer"),
    case("nproc-word", f"--nproc-per-node x {EXIT} 0 0", "'x'", "positive integer"),
    case("binding-unknown", f"--binding foo {EXIT} 0 0", "'foo'", "exclusive"),
    case("mem-policy-unknown", f"--mem-policy x {EXIT} 0 0", "'x'", "preferred"),
    case("unknown-flag", f"--bogus-flag {EXIT} 0 0", "--bogus-flag", "--help"),
    # --- the hang watchdog's options (docs/hangs.md)
    case("hang-timeout-negative", f"--hang-timeout -1 {EXIT} 0 0", "--hang-timeout", "'-1'", "seconds"),
    case("hang-timeout-word", f"--hang-timeout soon {EXIT} 0 0", "--hang-timeout", "'soon'"),
    case("hang-timeout-env", f"{EXIT} 0 0", "NUMARUN_HANG_TIMEOUT", "'nan'", NUMARUN_HANG_TIMEOUT="nan"),
    case("on-hang-unknown", f"--on-hang kill {EXIT} 0 0", "--on-hang", "'kill'", "report, stop"),
    case("on-hang-env", f"{EXIT} 0 0", "NUMARUN_ON_HANG", "'kill'", "report, stop", NUMARUN_ON_HANG="kill"),
    case("on-hang-config", f"--nproc-per-node 1 {TRAIN} launcher.on_hang=kill", "launcher.on_hang", "'kill'"),
    case("hang-timeout-config", f"--nproc-per-node 1 {TRAIN} launcher.hang_timeout=-5", "launcher.hang_timeout", "'-5"),
    case("nnodes-zero", f"--nnodes 0 {EXIT} 0 0", "'0'", "MIN:MAX"),
    case("nnodes-min-over-max", f"--nnodes 2:1 {EXIT} 0 0", "'2:1'", "MIN <= MAX"),
    case("nnodes-word", f"--nnodes two {EXIT} 0 0", "'two'", "MIN:MAX"),
    case("rdzv-backend-unknown", f"--rdzv-backend bogus {EXIT} 0 0", "'bogus'", "c10d"),
    case("max-restarts-word", f"--max-restarts x {EXIT} 0 0", "'x'", "int"),
    case("log-level-unknown", f"--log-level LOUD {EXIT} 0 0", "'LOUD'", "DEBUG"),
    case("run-path", f"--run-path {EXIT} 0 0", "--run-path", "left out"),
    case("module-and-no-python", f"--module --no-python {EXIT}", "--no-python", "at most one"),
    case("missing-script", "--nproc-per-node 1 no/such/script.py", "no/such/script.py", "Python script"),
    case("missing-program", "--no-python no-such-program-xyz", "no-such-program-xyz", "on PATH"),
    case("plan-file-missing", f"--plan-file {{bad}}/nope.json {EXIT} 0 0", "nope.json", "numarun plan --json"),
    case(
        "plan-file-not-a-plan", f"--plan-file {{bad}}/snapshot.json {EXIT} 0 0", "snapshot.json", "numarun plan --json"
    ),
    case(
        "plan-file-rank-count",
        f"--plan-file {{bad}}/plan1.json --nproc-per-node 2 {EXIT} 0 0",
        "plan1.json",
        "has 1 rank;",
    ),
    # --- impossible plans
    case("more-ranks-than-gpus", f"plan --topology {P4D} --nproc-per-node 9", "9", "at most 8"),
    case(
        "more-ranks-than-cores",
        f"plan --topology {P4} --nproc-per-node 9 --binding exclusive",
        "9",
        "at least one core per rank",
        CUDA_VISIBLE_DEVICES="",
    ),
    case("run-more-ranks-than-gpus", f"--topology {P4D} --nproc-per-node 9 {EXIT} 0 0", "9", "at most 8"),
    case("trainer-impossible-plan", f"--topology {P4D} --nproc-per-node 9 {TRAIN} trainer.steps=1", "9", "at most 8"),
    # --- topology sources
    case("topology-missing", "plan --topology {bad}/nope", "nope", "expected a directory"),
    case("topology-empty-json", "plan --topology {bad}/empty.json", "empty.json", "numarun topo --json"),
    case("topology-truncated-json", "plan --topology {bad}/truncated.json", "truncated.json", "numarun topo --json"),
    case("topology-json-list", "plan --topology {bad}/list.json", "list.json", "numarun topo --json"),
    case("topology-schema-version", "plan --topology {bad}/v99.json", "v99.json", "schema_version"),
    case("topology-binary", "plan --topology {bad}/binary.txt", "binary.txt", "not text"),
    case("topology-truncated-xml", "plan --topology {bad}/truncated.xml", "truncated.xml", "hwloc"),
    case("topology-smi-empty", "plan --topology {bad}/empty.txt", "empty.txt", "nvidia-smi"),
    case("topology-smi-garbage", "plan --topology {bad}/garbage.txt", "garbage.txt", "nvidia-smi"),
    case("topology-empty-dir", "plan --topology {bad}/emptydir", "emptydir", "sys"),
    case("tree-cpulist-reversed", "plan --topology {tree}/reversed", "'3-1'", "cpulist"),
    case("tree-cpulist-words", "plan --topology {tree}/words", "'a-b'", "cpulist"),
    case("tree-cpulist-huge", "plan --topology {tree}/huge", "99999999999", "cpulist"),
    case("topo-json-missing", "topo --topology {bad}/nope.json", "nope.json", "expected"),
    # --- CUDA_VISIBLE_DEVICES against an 8-GPU recorded machine
    case("cvd-out-of-range", f"plan --topology {P4D}", "'8'", "0-7", CUDA_VISIBLE_DEVICES="8"),
    case("cvd-duplicate", f"plan --topology {P4D}", "'0,0'", "at most once", CUDA_VISIBLE_DEVICES="0,0"),
    case("cvd-not-a-number", f"plan --topology {P4D}", "'x'", "GPU indices", CUDA_VISIBLE_DEVICES="0,x"),
    case(
        "cvd-uuid-without-uuids",
        f"plan --topology {P4D}",
        "GPU-nope",
        "GPU indices 0-7",
        CUDA_VISIBLE_DEVICES="GPU-nope",
    ),
    case(
        "cvd-unknown-uuid",
        "plan --topology {bad}/uuids.json",
        "GPU-deadbeef",
        "UUID",
        CUDA_VISIBLE_DEVICES="GPU-deadbeef",
    ),
    case(
        "cvd-mig-uuid",
        f"plan --topology {P4D}",
        "MIG-4f5e1b2a",
        "GPU UUIDs",
        CUDA_VISIBLE_DEVICES="MIG-4f5e1b2a-1c3d-5e6f-7a8b-9c0d1e2f3a4b",
    ),
    case("cvd-mig-legacy", f"plan --topology {P4D}", "MIG-GPU-abc/1/0", "MIG", CUDA_VISIBLE_DEVICES="MIG-GPU-abc/1/0"),
    case("cvd-run", f"--topology {P4D} {EXIT} 0 0", "'8'", "0-7", CUDA_VISIBLE_DEVICES="8"),
    # --- Hydra overrides of the reference trainer
    case("override-unknown-key", f"--nproc-per-node 1 {TRAIN} nosuch.key=1", "nosuch.key=1", "expected the keys"),
    case("override-wrong-type", f"--nproc-per-node 1 {TRAIN} trainer.steps=x", "trainer.steps=x", "Integer"),
    case("override-bad-group", f"--nproc-per-node 1 {TRAIN} parallel=nope", "parallel=nope", "ddp fsdp"),
    case("override-malformed", f"--nproc-per-node 1 {TRAIN} a==b", "a==b", "expected"),
    case("override-empty-group", f"--nproc-per-node 1 {TRAIN} model=", "model=", "gpt mlp"),
    case("override-out-of-range", f"--nproc-per-node 1 {TRAIN} trainer.steps=-3", "-3", ">= 1"),
    case("override-group-int", f"--nproc-per-node 1 {TRAIN} +trainer=2", "+trainer=2", "expected"),
    case("run-dir-in-proc", f"--nproc-per-node 1 {TRAIN} hydra.run.dir=/proc/x", "/proc/x", "writable directory"),
    # --- trainer layouts the world, the model or the schedule cannot take: refused with the plan, before any rank
    case("layout-product", f"{LAYOUT2} parallel.pp=2 parallel.dp_shard=2", "multiply to 4", "the job has 2 ranks"),
    case("layout-rest-not-dividing", f"{LAYOUT2} parallel.pp=3", "2 ranks", "product 3"),
    case("layout-two-rests", f"{LAYOUT2} parallel.dp_replicate=-1", "-1 for both", "at most one dimension"),
    case("layout-degree-word", f"{LAYOUT2} parallel.tp=half", "parallel.tp 'half'", "nproc_per_node"),
    case("layout-cp", f"{LAYOUT2} parallel.cp=2", "parallel.cp 2", "parallel.cp=1"),
    case(
        "layout-1f1b-microbatches",
        f"{LAYOUT2} parallel.pp=2 parallel.pp_microbatches=1",
        "pp_microbatches 1",
        "at least as many microbatches as stages (2)",
    ),
    case(
        "layout-interleaved-one-stage",
        f"{LAYOUT2} parallel.pp=2 parallel.pp_schedule=Interleaved1F1B parallel.pp_stages_per_rank=1",
        "pp_stages_per_rank 1",
        "2 or more",
    ),
    case(
        "layout-interleaved-rounds",
        f"{LAYOUT2} parallel.pp=2 parallel.pp_schedule=Interleaved1F1B parallel.pp_microbatches=5",
        "pp_microbatches 5",
        "multiple of the rounds",
    ),
    case(
        "layout-stages-over-layers",
        f"{LAYOUT2} model.n_layers=1 parallel.pp=2 parallel.pp_schedule=LoopedBFS",
        "4 pipeline stages",
        "at most 3",
    ),
    case("layout-split", f"{LAYOUT2} parallel.pp=2 parallel.pp_split=[2,1]", "pp_split [2, 1]", "model.n_layers=2"),
    case(
        "layout-batch-microbatches",
        f"{LAYOUT2} parallel.pp=2 parallel.pp_microbatches=3",
        "pp_microbatches 3",
        "a divisor of 16",
    ),
    case("layout-batch-auto", f"{LAYOUT2} parallel.pp=2 trainer.batch_size=auto", "'auto'", "an integer"),
    case("layout-tp-heads", f"{LAYOUT2} model.n_heads=1 parallel.tp=2", "parallel.tp 2", "divides model.n_heads"),
    case(
        "layout-schedule",
        f"{LAYOUT2} parallel.pp=2 parallel.pp_schedule=Zigzag",
        "'Zigzag'",
        "GPipe, 1F1B, Interleaved1F1B",
    ),
    case(
        "layout-mesh-differs",
        f"--topology {P4D} --nproc-per-node 2 --mesh tp=2 {TRAIN} model=gpt parallel=fsdp parallel.pp=2",
        "--mesh 'tp=2'",
        "pp=2,dp_replicate=1,dp_shard=1,cp=1,tp=1",
    ),
    case("layout-hierarchical", f"{LAYOUT2} parallel.tp=2 comm=hierarchical", "'hierarchical'", "expected flat"),
    case(
        "run-dir-under-a-file",
        f"--nproc-per-node 1 {TRAIN} hydra.run.dir={{bad}}/empty.txt/run",
        "empty.txt/run",
        "writable directory",
    ),
    case(
        "run-dir-is-a-file",
        f"--nproc-per-node 1 {TRAIN} hydra.run.dir={{bad}}/empty.txt",
        "empty.txt",
        "not a directory",
    ),
    # --- numarun submit (rendered only)
    case("submit-time-word", f"submit --dry-run --time abc {TRAIN}", "'abc'", "HH:MM:SS"),
    case("submit-time-four-parts", f"submit --dry-run --time 1:2:3:4 {TRAIN}", "'1:2:3:4'", "D-HH:MM:SS"),
    case("submit-zero-nodes", f"submit --dry-run --nodes 0 {TRAIN}", "--nodes '0'", "1 <= MIN <= MAX"),
    case("submit-nodes-word", f"submit --dry-run --nodes x {TRAIN}", "--nodes 'x'", "N or MIN:MAX"),
    case("submit-nodes-elastic", f"submit --dry-run --nnodes 1:4 {TRAIN}", "--nnodes '1:4'", "fixed node count"),
    case("submit-gpus-negative", f"submit --dry-run --gpus-per-node -1 {TRAIN}", "'-1'", "TYPE:N"),
    case("submit-mem-word", f"submit --dry-run --mem lots {TRAIN}", "'lots'", "16G"),
    case("submit-env-no-equals", f"submit --dry-run --env NOEQ {TRAIN}", "'NOEQ'", "KEY=VALUE"),
    case("submit-missing-script", "submit --dry-run no/such.py", "no/such.py", "existing script"),
    case("submit-bad-choice", f"submit --dry-run --hydra-run-dir maybe {TRAIN}", "'maybe'", "auto"),
    # --- whole numbers past what they feed (ranks, nodes, ports, sizes, counts, seconds)
    case("nproc-huge", f"--nproc-per-node 99999999999999999999 {EXIT} 0 0", "'99999999999999999999'", "up to 8192"),
    case("nnodes-huge", f"--nnodes 99999999999999999999 {EXIT} 0 0", "'99999999999999999999'", "<= 131072"),
    case("nnodes-max-huge", f"--nnodes 1:99999999999999999999 {EXIT} 0 0", "99999999999999999999", "<= 131072"),
    case(
        "max-restarts-huge",
        f"--max-restarts 99999999999999999999 {EXIT} 0 0",
        "'99999999999999999999'",
        "at most 1000000",
    ),
    case(
        "shutdown-timeout-huge",
        f"--shutdown-timeout 99999999999999999999 {EXIT} 0 0",
        "'99999999999999999999'",
        "at most",
    ),
    case(
        "trainer-nproc-huge",
        [TRAIN, "launcher.nproc_per_node=99999999999999999999"],
        "99999999999999999999",
        "1 to 8192",
    ),
    case(
        "plan-nproc-huge",
        f"plan --topology {P4D} --nproc-per-node 99999999999999999999",
        "'99999999999999999999'",
        "up to 8192",
    ),
    case(
        "topo-width-huge", f"topo --topology {P4D} --width 99999999999999999999", "'99999999999999999999'", "1 to 10000"
    ),
    case(
        "doctor-nnodes-huge",
        f"doctor --topology {P4D} --nnodes 99999999999999999999",
        "99999999999999999999",
        "<= 131072",
    ),
    case("doctor-port-huge", f"doctor --topology {P4D} --nnodes 2 --master-port 99999", "'99999'", "1 to 65535"),
    case(
        "tune-trials-huge",
        f"tune --trials 99999999999999999999 --binding none,node {EXIT}",
        "'99999999999999999999'",
        "1 to 1000000",
    ),
    case(
        "tune-nproc-huge",
        f"tune --nproc-per-node 99999999999999999999 --binding none,node {EXIT}",
        "'99999999999999999999'",
        "up to 8192",
    ),
    case(
        "bench-nproc-huge",
        "bench allreduce --nproc-per-node 99999999999999999999",
        "'99999999999999999999'",
        "up to 8192",
    ),
    case("bench-iters-huge", "bench allreduce --iters 99999999999999999999", "'99999999999999999999'", "1 to 1000000"),
    case("bench-port-huge", "bench allreduce --master-port 99999", "'99999'", "1 to 65535"),
    case("bench-size-huge", "bench allreduce --sizes 99999999999999999999G", "99999999999999999999G", "up to 1T"),
    case("h2d-iters-huge", "bench h2d --iters 99999999999999999999", "'99999999999999999999'", "1 to 1000000"),
    case(
        "submit-nodes-huge",
        f"submit --dry-run --nodes 99999999999999999999 {TRAIN}",
        "'99999999999999999999'",
        "<= 131072",
    ),
    case(
        "rdzv-conf-timeout-huge",
        f"--nproc-per-node 1 --rdzv-conf join_timeout=99999999999999999999 {EXIT} 0 0",
        "join_timeout='99999999999999999999'",
        "from 1 to 2592000",
    ),
    case("tune-omp-huge", f"tune --omp 99999999999999999999,1 {EXIT}", "'99999999999999999999'", "from 1 to 8192"),
    case(
        "submit-gpus-huge",
        f"submit --dry-run --gpus-per-node 99999999999999999999 {TRAIN}",
        "'99999999999999999999'",
        "up to 9999",
    ),
    case(
        "submit-mem-huge",
        f"submit --dry-run --mem 99999999999999999999G {TRAIN}",
        "'99999999999999999999G'",
        "12 digits",
    ),
    case(
        "submit-signal-before-huge",
        f"submit --dry-run --signal-before 99999999999999999999 {TRAIN}",
        "'99999999999999999999'",
        "0 to 2592000",
    ),
    # --- nan and inf are not numbers of seconds or fractions
    case("watch-interval-nan", f"--watch-interval nan {EXIT} 0 0", "'nan'", "finite number of seconds"),
    case("watch-interval-inf", f"--watch-interval inf {EXIT} 0 0", "'inf'", "finite number of seconds"),
    case("monitor-interval-inf", f"--monitor-interval inf {EXIT} 0 0", "inf", "finite number of seconds"),
    case("run-doctor-timeout-nan", f"--doctor-timeout nan {EXIT} 0 0", "'nan'", "finite number"),
    case("doctor-timeout-inf", f"doctor --topology {P4D} --doctor-timeout inf", "'inf'", "finite number of seconds"),
    case("submit-poll-nan", f"submit --dry-run --poll-seconds nan {TRAIN}", "'nan'", "finite number of seconds"),
    # --- every option checked before any rank starts
    case("bench-size-before-ranks", "bench allreduce --sizes 1e400", "'1e400'", "binary units"),
    case("bench-rate-before-ranks", "bench allreduce --link-rate fast", "'fast'", "200mbit"),
    # --- a parallel layout: --mesh, NUMARUN_MESH, launcher.mesh, the trainer's parallel.* (docs/layouts.md)
    case(
        "mesh-fullwidth-digit",
        f"{PLAN2} --mesh tp=\uff12",
        "--mesh 'tp=\uff12'",
        "is not an integer",
        "pp=2,dp_shard=-1",
    ),
    case("mesh-arabic-digit", f"{PLAN2} --mesh tp=\u0662", "'tp=\u0662'", "is not an integer"),
    case("mesh-superscript-digit", f"{PLAN2} --mesh tp=\u00b2", "'tp=\u00b2'", "is not an integer"),
    case("mesh-upper-case", f"{PLAN2} --mesh TP=2", "unknown dimension 'TP'", "pp, dp_replicate, dp_shard, cp, tp"),
    case("mesh-empty-part", f"{PLAN2} --mesh tp=2,,pp=1", "'tp=2,,pp=1'", "'' is not name=size"),
    case("mesh-trailing-comma", f"{PLAN2} --mesh tp=2,", "'tp=2,'", "is not name=size"),
    case("mesh-empty", [*PLAN2.split(), "--mesh", ""], "--mesh ''", "empty", "name=size"),
    case("mesh-odd-characters", f"{PLAN2} --mesh tp=2;rm", "tp='2;rm'", "is not an integer"),
    case("mesh-no-size", f"{PLAN2} --mesh tp", "'tp' is not name=size", "name=size"),
    case(
        "mesh-huge",
        f"{PLAN2} --mesh tp=99999999999999999999",
        "tp=99999999999999999999 is past 1048576",
        "1 to 1048576",
    ),
    case("mesh-zero", f"{PLAN2} --mesh tp=0", "tp=0 is not a positive size", "or -1"),
    case("mesh-minus-zero", f"{PLAN2} --mesh tp=-0", "tp=-0 is not a positive size", "or -1"),
    case("mesh-two-rests", f"{PLAN2} --mesh tp=-1,pp=-1", "-1 for both tp and pp", "at most one"),
    case("mesh-named-twice", f"{PLAN2} --mesh tp=1,tp=2", "tp is named twice", "at most once"),
    case("mesh-product", f"{PLAN2} --mesh tp=4", "multiply to 4", "product is 2"),
    case("mesh-env", f"{PLAN2}", "NUMARUN_MESH 'tp=\u0662'", "is not an integer", NUMARUN_MESH="tp=\u0662"),
    case("mesh-env-upper", f"--dry-run {PLAN2[5:]} {EXIT} 0 0", "NUMARUN_MESH 'TP=2'", "unknown", NUMARUN_MESH="TP=2"),
    case(
        "mesh-run", f"--dry-run {PLAN2[5:]} --mesh tp=2,pp=-1,dp_shard=-1 {EXIT} 0 0", "-1 for both pp", "at most one"
    ),
    case("mesh-config", [TRAIN, "launcher.mesh=99"], "launcher.mesh '99'", "'99' is not name=size"),
    case("plan-nnodes-word", f"{PLAN2} --nnodes x", "--nnodes 'x'", "MIN:MAX"),
    case("run-nnodes-superscript", f"--nnodes 1:\u00b2 {EXIT} 0 0", "--nnodes '1:\u00b2'", "MIN:MAX"),
    case("pet-nnodes-superscript", f"--nproc-per-node 1 {EXIT} 0 0", "'\u00b2'", "MIN:MAX", PET_NNODES="\u00b2"),
    case("nproc-arabic-digit", f"--nproc-per-node \u0662 {EXIT} 0 0", "'\u0662'", "positive integer"),
    case("nproc-underscore", f"--nproc-per-node 1_6 {EXIT} 0 0", "'1_6'", "positive integer"),
    case("master-port-fullwidth", f"--master-port \uff12\uff19\uff15\uff10\uff10 {EXIT} 0 0", "'\uff12", "1 to 65535"),
    case("rdzv-conf-superscript", f"--rdzv-conf join_timeout=\u00b2 {EXIT} 0 0", "join_timeout='\u00b2'", "from 1 to"),
    case("cvd-superscript", f"plan --topology {P4D}", "'\u00b2'", "GPU indices", CUDA_VISIBLE_DEVICES="\u00b2"),
    case("cvd-arabic-digit", f"plan --topology {P4D}", "'\u0662'", "GPU indices", CUDA_VISIBLE_DEVICES="\u0662"),
    case("tune-omp-superscript", f"tune --omp \u00b2,1 --binding none,node {EXIT}", "'\u00b2'", "integers from 1"),
    case("layout-degree-superscript", [*LAYOUT2.split(), "parallel.tp='\u00b2'"], "parallel.tp '\u00b2'", ">= 1"),
    case("layout-degree-arabic", [*LAYOUT2.split(), "parallel.tp='\u0662'"], "parallel.tp '\u0662'", ">= 1"),
    case("layout-degree-two-minus", [*LAYOUT2.split(), "parallel.tp='--2'"], "parallel.tp '--2'", "-1 (the rest)"),
    case("layout-degree-zero", f"{LAYOUT2} parallel.tp=0", "parallel.tp 0", "integer >= 1"),
    case("layout-three-rests", f"{LAYOUT2} parallel.pp=-1 parallel.tp=-1", "are all -1", "at most one degree -1"),
    case("layout-split-nested", f"{LAYOUT2} parallel.pp=2 parallel.pp_split=[[1],[1]]", "[[1], [1]]", "block counts"),
    case("layout-microbatches-zero", f"{LAYOUT2} parallel.pp=2 parallel.pp_microbatches=0", "microbatches 0", ">= 1"),
    case("layout-schedule-empty", [*LAYOUT2.split(), "parallel.pp=2", "parallel.pp_schedule=''"], "''", "GPipe, 1F1B"),
    # --- the hang watchdog's options and numarun stacks (docs/hangs.md)
    case("hang-timeout-nan", f"--hang-timeout nan {EXIT} 0 0", "--hang-timeout 'nan'", "finite number of seconds"),
    case("hang-timeout-inf", f"--hang-timeout inf {EXIT} 0 0", "--hang-timeout 'inf'", "finite number of seconds"),
    case("hang-timeout-overflow", f"--hang-timeout 1e400 {EXIT} 0 0", "'1e400'", "<= 2592000"),
    case("hang-timeout-arabic", f"--hang-timeout \u0663\u0660 {EXIT} 0 0", "'\u0663\u0660'", "finite number"),
    case("hang-timeout-underscore", f"--hang-timeout 1_000 {EXIT} 0 0", "'1_000'", "finite number"),
    case("hang-timeout-env-inf", f"{EXIT} 0 0", "NUMARUN_HANG_TIMEOUT '-inf'", "finite", NUMARUN_HANG_TIMEOUT="-inf"),
    case(
        "hang-timeout-config-overflow", [TRAIN, "launcher.hang_timeout=1e400"], "launcher.hang_timeout 'inf'", "finite"
    ),
    case("on-hang-upper-case", f"--on-hang STOP {EXIT} 0 0", "--on-hang 'STOP'", "report, stop"),
    case("on-hang-empty", ["--on-hang", "", EXIT, "0", "0"], "--on-hang ''", "report, stop"),
    case("stacks-pid-negative", "stacks --pid -5", "--pid '-5'", "from 1 to 4194304"),
    case("stacks-pid-word", "stacks --pid abc", "--pid 'abc'", "whole number"),
    case("stacks-pid-arabic", "stacks --pid \u0663", "--pid '\u0663'", "whole number"),
    case("stacks-pid-init", "stacks --pid 1", "--pid 1", "no numarun job", "numarun stacks --list"),
    case("stacks-pid-none", "stacks --pid 4194304", "--pid 4194304", "no numarun job"),  # past any pid_max: never a pid
    # --- the step report's option and variables, numarun top (docs/steps.md)
    case("step-report-word", f"--step-report maybe {EXIT} 0 0", "--step-report 'maybe'", "on, off"),
    case("step-report-upper-case", f"--step-report ON {EXIT} 0 0", "--step-report 'ON'", "on, off"),
    case("step-report-empty", ["--step-report", "", EXIT, "0", "0"], "--step-report ''", "on, off"),
    case("step-report-env", f"{EXIT} 0 0", "NUMARUN_STEP_REPORT 'maybe'", "on, off", NUMARUN_STEP_REPORT="maybe"),
    case("step-report-env-one", f"{EXIT} 0 0", "NUMARUN_STEP_REPORT '1'", "on, off", NUMARUN_STEP_REPORT="1"),
    case("step-report-config", [TRAIN, "launcher.step_report=maybe"], "launcher.step_report 'maybe'", "on, off"),
    *(
        case(f"step-interval-{name}", f"{EXIT} 0 0", f"NUMARUN_STEP_INTERVAL '{v}'", ">= 0.1", NUMARUN_STEP_INTERVAL=v)
        for name, v in [
            ("zero", "0"),
            ("negative", "-1"),
            ("nan", "nan"),
            ("inf", "inf"),
            ("word", "abc"),
            ("below-a-look", "0.01"),
            ("overflow", "1e400"),
            ("arabic", "\u0663"),
        ]
    ),
    case("top-interval-zero", "top --interval 0", "--interval '0'", "seconds >= 0.1"),
    case("top-interval-negative", "top --interval -1", "--interval '-1'", "seconds >= 0.1"),
    case("top-interval-nan", "top --interval nan", "--interval 'nan'", "finite number of seconds"),
    case("top-interval-inf", "top --interval inf", "--interval 'inf'", "finite number of seconds"),
    case("top-interval-word", "top --interval abc", "--interval 'abc'", "finite number of seconds"),
    case("top-interval-once", "top --once --interval 3", "--interval 3 with --once", "one of them"),
    case("top-interval-json", "top --json --interval 3", "--interval 3 with --json", "one of them"),
    case("top-pid-negative", "top --pid -3", "--pid '-3'", "from 1 to 4194304"),
    case("top-pid-word", "top --pid abc", "--pid 'abc'", "whole number"),
    case("top-pid-zero", "top --pid 0", "--pid '0'", "from 1 to 4194304"),
    case("top-pid-none", "top --pid 4194304", "--pid 4194304", "no numarun job"),
    case("stacks-pid-zero", "stacks --pid 0", "--pid '0'", "from 1 to 4194304"),
    case("stacks-timeout-zero", "stacks --timeout 0", "--timeout '0'", "seconds > 0"),
    case("stacks-timeout-nan", "stacks --timeout nan", "--timeout 'nan'", "finite number of seconds"),
    case("stacks-list-pid", "stacks --list --pid 3", "--pid 3 with --list", "one of them"),
    case("stacks-list-full", "stacks --list --full", "--full with --list", "one of them"),
    # --- trainer keys the job's layout never reads (docs/trainer.md)
    case(
        "unread-pp-split",
        [TRAIN, "parallel.pp_split=[1,1,1,1,1,1,1,1,1]"],
        "parallel.pp_split [1, 1, 1, 1, 1, 1, 1, 1, 1]",
        "no pipeline stages",
        "parallel.pp > 1",
    ),
    case(
        "unread-pp-schedule", [TRAIN, "parallel.pp_schedule=GPipe"], "parallel.pp_schedule 'GPipe'", "parallel.pp > 1"
    ),
    case("unread-pp-microbatches", [TRAIN, "parallel.pp_microbatches=4"], "parallel.pp_microbatches 4", "no pipeline"),
    case("unread-pp-stages-per-rank", [TRAIN, "parallel.pp_stages_per_rank=2"], "pp_stages_per_rank 2", "no pipeline"),
    case(
        "unread-reshard",
        f"{LAYOUT2} parallel=ddp parallel.reshard_after_forward=false",
        "parallel.reshard_after_forward false",
        "FSDP2 shards nothing",
    ),
    case("unread-bucket-fsdp", f"{LAYOUT2} comm.bucket_mb=4", "comm.bucket_mb 4.0", "no DDP runs here"),
    case("unread-compression-fsdp", f"{LAYOUT2} comm.compression=bf16", "comm.compression 'bf16'", "no DDP"),
    case("unread-bucket-one-rank", ["--nproc-per-node", "1", TRAIN, "comm.bucket_mb=4"], "comm.bucket_mb", "no DDP"),
    case("unread-chunk-flat", [TRAIN, "comm.chunk_mb=1"], "comm.chunk_mb 1.0", "comm=hierarchical"),
    case("unread-overlap-flat", [TRAIN, "comm.overlap=false"], "comm.overlap false", "comm=hierarchical"),
    case(
        "unread-hierarchical-one-rank", ["--nproc-per-node", "1", TRAIN, "comm=hierarchical"], "'hierarchical'", "flat"
    ),
    case("unread-memory-limit", [TRAIN, "trainer.memory_limit_mb=100"], "trainer.memory_limit_mb 100", "auto"),
    case("unread-auto-max-batch", [TRAIN, "trainer.auto_max_batch=8"], "trainer.auto_max_batch 8", "auto"),
    # --- nesting bounded in every JSON reader
    case("topology-deep-json", "plan --topology {bad}/deep.json", "deep.json", "nested deeper than 64 levels"),
    case(
        "topology-deep-object",
        "plan --topology {bad}/deep-object.json",
        "deep-object.json",
        "nested deeper than 64 levels",
    ),
    case(
        "plan-file-deep-json", f"--plan-file {{bad}}/deep.json {EXIT} 0 0", "deep.json", "nested deeper than 64 levels"
    ),
    case(
        "override-deep",
        [TRAIN, "trainer.seed=" + "[" * 3000 + "]" * 3000],
        "trainer.seed=[[[",
        "nested at most 64 levels",
    ),
    case("config-file-deep", f"{TRAIN} --config-dir {{bad}} --config-name deep", "deep", "nested at most 64 levels"),
    # --- --json prints to stdout and takes no file (--json-file FILE does): the old spellings, refused
    case("tune-json-file", f"tune --binding none --json t.json {EXIT}", "--json 't.json'", "--json-file t.json"),
    case("tune-json-equals", f"tune --binding none --json=t.json {EXIT}", "--json 't.json'", "--json-file t.json"),
    case("bench-json-file", "bench allreduce --json out.json", "--json 'out.json'", "--json-file out.json"),
    case("h2d-json-equals", "bench h2d --json=out.json", "--json 'out.json'", "--json-file out.json"),
    # --- a standard output that cannot be written: one line, exit 1
    unwritable("topo-to-dev-full", f"topo --topology {P4D}", "standard output", "No space left on device"),
    unwritable("topo-json-to-dev-full", f"topo --json --topology {P4D}", "standard output", "No space left on device"),
    unwritable(
        "plan-json-to-dev-full",
        f"plan --json --topology {P4D} --nproc-per-node 1",
        "standard output",
        "No space left on device",
    ),
    unwritable(
        "dry-run-to-dev-full",
        f"--dry-run --topology {P4D} --nproc-per-node 1 {EXIT} 0 0",
        "standard output",
        "No space left on device",
    ),
]

# Real subprocesses of the installed entry point: the no-traceback promise end to end.
SUBPROCESS = [
    "nnodes-zero",
    "tree-cpulist-reversed",
    "cvd-mig-uuid",
    "trainer-impossible-plan",
    "submit-time-word",
    "nproc-huge",
    "topo-to-dev-full",
    "plan-json-to-dev-full",
]


@pytest.fixture(scope="module")
def bad(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Broken topology files, a plan, a snapshot with GPU UUIDs."""
    d = tmp_path_factory.mktemp("bad")
    from numarun.topology.discover import load_topology

    snapshot = load_topology(P4D).to_json()
    (d / "snapshot.json").write_text(snapshot)
    (d / "empty.json").write_text("")
    (d / "truncated.json").write_text(snapshot[: len(snapshot) // 2])
    (d / "list.json").write_text("[1, 2, 3]\n")
    data = json.loads(snapshot)
    (d / "v99.json").write_text(json.dumps({**data, "schema_version": 99}))
    for i, gpu in enumerate(data["gpus"]):
        gpu["uuid"] = f"GPU-{i:08x}-0000-0000-0000-000000000000"
    (d / "uuids.json").write_text(json.dumps(data))
    (d / "binary.txt").write_bytes(bytes(range(256)) * 4)
    (d / "truncated.xml").write_text((FIX / "hwloc" / "nvidiaDGX2.xml").read_text()[:300])
    (d / "empty.txt").write_text("")
    (d / "garbage.txt").write_text("this is not the output of nvidia-smi topo -m\n")
    (d / "emptydir").mkdir()
    (d / "deep.json").write_text("[" * 100_000 + "]" * 100_000)  # past Python's parser's own limit
    (d / "deep.yaml").write_text("trainer:\n  seed: " + "[" * 3000 + "]" * 3000 + "\n")
    deep = {"schema_version": data["schema_version"], "cpus": []}
    for _ in range(300):  # parses, but deeper than any reader should walk
        deep = {"cpus": [deep]}
    (d / "deep-object.json").write_text(json.dumps({**data, "numa_nodes": [deep]}))
    from numarun.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["plan", "--json", "--topology", P4D, "--nproc-per-node", "1"]) == 0
    (d / "plan1.json").write_text(out.getvalue())
    return d


@pytest.fixture(scope="module")
def tree(h200_tree: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Copies of the recorded H200 VM tree, each with node0's cpulist damaged."""
    d = tmp_path_factory.mktemp("trees")
    for name, text in [("reversed", "3-1\n"), ("words", "a-b\n"), ("huge", "0-99999999999\n")]:
        shutil.copytree(h200_tree, d / name, symlinks=True)
        (d / name / NODE0).write_text(text)
    return d


def _argv(c: Case, bad: Path, tree: Path) -> list[str]:
    return [a.replace("{bad}", str(bad)).replace("{tree}", str(tree)) for a in c.argv]


# submit cases may ask sinfo what a node holds (a process): they run in the slow tier
@pytest.mark.parametrize(
    "c", [pytest.param(c, id=c.id, marks=[pytest.mark.slow] if c.id.startswith("submit-") else []) for c in CASES]
)
def test_bad_input_is_one_line_exit_2(
    c: Case, bad: Path, tree: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, err = run_in_process(_argv(c, bad, tree), tmp_path, capsys, monkeypatch, env=c.env, stdout=c.stdout)
    check_refusal(code, err, c, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("name", SUBPROCESS)
def test_bad_input_end_to_end(name: str, bad: Path, tree: Path, tmp_path: Path) -> None:
    c = next(c for c in CASES if c.id == name)
    with open(c.stdout or os.devnull, "w") as out:  # at exit, Python flushes stdout once more: nothing may be said then
        r = subprocess.run(
            [*numarun_cmd(), *_argv(c, bad, tree)],
            cwd=tmp_path,
            env=clean_env(**c.env),
            stdout=out,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    check_refusal(r.returncode, r.stderr, c, tmp_path)


def test_stacks_with_no_job_to_read_is_one_line_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``numarun stacks`` where no job of the user runs: its documented code, 1 (docs/hangs.md)."""
    (tmp_path / "tmp").mkdir()
    (tmp_path / "work").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # where numarun looks for its jobs
    c = replace(case("stacks-no-job", "stacks", "no numarun job of yours runs on this node", "--pid PID"), code=1)
    code, err = run_in_process(c.argv, tmp_path / "work", capsys, monkeypatch)
    check_refusal(code, err, c, tmp_path / "work")


@pytest.mark.slow
def test_stacks_pid_of_a_process_that_adopted_another_job_s_rank_is_no_job(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``numarun stacks --pid P`` goes through P's children only to find ranks of P's own job: pid 1 (or any
    subreaper) adopts orphaned ranks of other jobs, and ``--pid 1`` must not show one of those."""
    state = tmp_path / "numarun-other"
    state.mkdir()
    (state / "job.json").write_text(json.dumps({"pid": 4194304, "started": 0.0, "argv": ["numarun", "x.py"]}))
    (tmp_path / "work").mkdir()
    child = subprocess.Popen(["sleep", "120"], env={**os.environ, "NUMARUN_STATE_DIR": str(state)})
    try:  # this process stands for the adopter: the child is its, the job another numarun's
        c = case("stacks-pid-adopter", f"stacks --pid {os.getpid()}", f"--pid {os.getpid()}", "no numarun job")
        code, err = run_in_process(c.argv, tmp_path / "work", capsys, monkeypatch)
    finally:
        child.kill()
        child.wait()
    check_refusal(code, err, c, tmp_path / "work")


def test_table_is_large_and_distinct() -> None:
    assert len(CASES) >= 40
    assert len({c.id for c in CASES}) == len(CASES)
    assert len({(c.argv, tuple(sorted(c.env.items()))) for c in CASES}) == len(CASES)
