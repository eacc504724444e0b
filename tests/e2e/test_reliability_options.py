"""Every torchrun option numarun passes on is checked like numarun's own: one line, exit 2.

Types, ranges and names, before anything starts: each row would otherwise reach torchrun and
end in a traceback, hang on a rendezvous that cannot complete, or be ignored silently.
Rows run in-process through ``numarun.cli.main`` in an empty working directory that must
stay empty; a few run again as real subprocesses.
"""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest
from helpers import clean_env, numarun_cmd
from refusals import EXIT, TRAIN, Case, case, check_refusal, run_in_process

CASES: list[Case] = [
    case("max-restarts-negative", f"--max-restarts -5 {EXIT} 0 0", "'-5'", ">= 0"),
    case("master-port-too-big", f"--master-port 99999 {EXIT} 0 0", "99999", "1 to 65535"),
    case("master-port-zero", f"--master-port 0 {EXIT} 0 0", "'0'", "1 to 65535"),
    case("rdzv-conf-garbage", f"--rdzv-conf garbage {EXIT} 0 0", "'garbage'", "KEY=VALUE"),
    case("rdzv-conf-timeout-word", f"--rdzv-conf timeout=abc {EXIT} 0 0", "timeout='abc'", "timeout=N"),
    case("rdzv-conf-unknown-key", f"--rdzv-conf join_timout=5 {EXIT} 0 0", "'join_timout'", "join_timeout"),
    case("rdzv-conf-bool", f"--rdzv-conf is_host=maybe {EXIT} 0 0", "is_host='maybe'", "is_host=true"),
    case("log-dir-under-proc", f"--log-dir /proc/numarun-x {EXIT} 0 0", "'/proc/numarun-x'", "writable directory"),
    case("log-dir-is-a-file", f"--log-dir {EXIT} {EXIT} 0 0", "is not a directory"),
    case("signals-unknown", f"--signals-to-handle SIGFOO {EXIT} 0 0", "'SIGFOO'", "SIGTERM"),
    case("signals-sigkill", f"--signals-to-handle SIGTERM,SIGKILL {EXIT} 0 0", "'SIGKILL'", "can be handled"),
    case("node-rank-past-nnodes", f"--nnodes 2 --node-rank 5 {EXIT} 0 0", "--node-rank 5", "below --nnodes 2"),
    case("node-rank-negative", f"--node-rank -1 {EXIT} 0 0", "'-1'", ">= 0"),
    case("rdzv-endpoint-port-word", f"--rdzv-endpoint host:notaport {EXIT} 0 0", "'host:notaport'", "1 to 65535"),
    case("rdzv-endpoint-port-range", f"--rdzv-endpoint host:70000 {EXIT} 0 0", "'70000'", "HOST:PORT"),
    case("monitor-interval-zero", f"--monitor-interval 0 {EXIT} 0 0", "--monitor-interval", "> 0"),
    case("shutdown-timeout-zero", f"--shutdown-timeout 0 {EXIT} 0 0", "'0'", ">= 1"),
    case("redirects-bad", f"--redirects 9 {EXIT} 0 0", "'9'", "0-3"),
    case("tee-bad", f"--tee x:1 {EXIT} 0 0", "'x:1'", "LOCAL_RANK"),
    case(
        "local-ranks-filter-past-nproc", f"--nproc-per-node 1 --local-ranks-filter 0,3 {EXIT} 0 0", "'0,3'", "below 1"
    ),
    case("event-log-handler-unknown", f"--event-log-handler loud {EXIT} 0 0", "'loud'", "console"),
    case("logs-specs-unknown", f"--logs-specs nope {EXIT} 0 0", "'nope'", "torchrun.logs_specs"),
    case("role-empty", [*"--role".split(), "", EXIT, "0", "0"], "--role", "non-empty"),
    case(
        "master-addr-unresolvable",
        f"--master-addr no-such-host.invalid --nnodes 2 {EXIT} 0 0",
        "'no-such-host.invalid'",
        "/etc/hosts",
    ),
    case("master-addr-with-port", f"--master-addr node0:29500 {EXIT} 0 0", "'node0:29500'", "without a port"),
    case(
        "rdzv-endpoint-bad-ipv6",
        f"--rdzv-backend c10d --rdzv-endpoint fe80::1::2 {EXIT} 0 0",
        "'fe80::1::2'",
        "[ADDR]:PORT",
    ),
    case(
        "local-addr-unresolvable", f"--local-addr no-such-host.invalid {EXIT} 0 0", "'no-such-host.invalid'", "resolves"
    ),
    case("module-missing", "-m no_such_module_numarun", "'no_such_module_numarun'", "importable module"),
    case("module-parent-missing", "-m no_such_pkg_numarun.train", "'no_such_pkg_numarun.train'", "importable module"),
    # the same checks apply to values from the trainer's launcher config group
    case("trainer-launcher-master-port", [TRAIN, "launcher.master_port=99999"], "99999", "1 to 65535"),
]

SUBPROCESS = [
    "max-restarts-negative",
    "signals-unknown",
    "rdzv-conf-timeout-word",
    "node-rank-past-nnodes",
    "module-missing",
]


@pytest.mark.parametrize("c", CASES, ids=[c.id for c in CASES])
def test_torchrun_option_is_checked(
    c: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, err = run_in_process(c.argv, tmp_path, capsys, monkeypatch)
    check_refusal(code, err, c, tmp_path)


def test_a_taken_master_port_is_refused_before_launch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        s.listen()
        port = s.getsockname()[1]
        c = case("taken-port", f"--master-port {port} {EXIT} 0 0", str(port), "free port")
        code, err = run_in_process(c.argv, tmp_path, capsys, monkeypatch)
    check_refusal(code, err, c, tmp_path)


@pytest.mark.parametrize("value", ["join_timeout=15,close_timeout=5", "is_host=false,read_timeout=30", ""])
def test_good_rdzv_conf_passes(value: str) -> None:
    from numarun.launch.torchrun import check_rdzv_conf

    assert set(check_rdzv_conf(value)) == {kv.split("=")[0] for kv in value.split(",") if kv}


def test_runtime_errors_name_their_cause() -> None:
    from numarun.torch_private import runtime_cause

    e = RuntimeError(
        "The server socket has failed to listen on any local network address.\n"
        "port: 29500, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use"
    )
    assert (
        runtime_cause(e)
        == "RuntimeError: The server socket has failed to listen on any local network address. (address already in use)"
    )


@pytest.mark.slow
@pytest.mark.parametrize("name", SUBPROCESS)
def test_torchrun_option_end_to_end(name: str, tmp_path: Path) -> None:
    c = next(c for c in CASES if c.id == name)
    r = subprocess.run(
        [*numarun_cmd(), *c.argv], cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=120
    )
    check_refusal(r.returncode, r.stderr, c, tmp_path)


def test_table_is_distinct() -> None:
    assert len({c.id for c in CASES}) == len(CASES) and len({c.argv for c in CASES}) == len(CASES)
