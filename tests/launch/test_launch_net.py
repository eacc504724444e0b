"""Addresses: one host:port parser for every command, the address rule, and jobs that never hang on an address.

Pure tables first (the parser, the rule, the doctor's hostname check). Then real jobs, root only:
a UTS namespace whose hostname resolves to nothing (one node, ``--standalone`` too), two "nodes"
in network namespaces whose hostname maps to 127.0.1.1 meeting at node 0's own IP over c10d,
IPv6 loopback end to end for ``run`` and ``doctor``, and an endpoint where nothing listens.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest
from helpers import SCRIPTS, clean_env, error_lines, free_port, numarun_cmd

from numarun.errors import UsageError

HELLO = """import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
os.write(1, f"rank {dist.get_rank()} sum {t.item():g}\\n".encode())  # one write: lines of two ranks do not mix
dist.destroy_process_group()
"""
NORES = "numarun-nores.invalid"


def _v6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


# ----------------------------------------------------------------------------- the parser


@pytest.mark.parametrize(
    "text, expected",
    [
        ("node0", ("node0", None)),
        ("node0:29400", ("node0", 29400)),
        (" 10.0.0.1:1 ", ("10.0.0.1", 1)),
        ("[::1]:29500", ("::1", 29500)),
        ("[::1]", ("::1", None)),
        ("::1", ("::1", None)),
        ("fe80::1", ("fe80::1", None)),
        ("fe80::1%eth0", ("fe80::1%eth0", None)),
        ("[fe80::1%eth0]:7", ("fe80::1%eth0", 7)),
        ("h:65535", ("h", 65535)),
    ],
)
def test_endpoints_parse(text: str, expected: tuple[str, int | None]) -> None:
    from numarun.argtypes import host_port, parse_endpoint

    assert parse_endpoint(text, "--rdzv-endpoint") == expected
    assert parse_endpoint(host_port(*expected), "--x") == expected  # written back, read the same


@pytest.mark.parametrize(
    "text, port, words",
    [
        ("host:notaport", None, ("'host:notaport'", "port 'notaport'", "1 to 65535")),
        ("host:70000", None, ("port '70000'",)),
        ("host:0", None, ("port '0'",)),
        ("h:", None, ("port ''",)),
        ("a:b:c", None, ("'a:b:c'", "[ADDR]:PORT")),
        ("[::1", None, ("'[::1'",)),
        ("[node0]:1", None, ("'[node0]:1'",)),
        ("[::1]x", None, ("'[::1]x'",)),
        ("", None, ("''",)),
        ("h :1", None, ("'h :1'",)),
        ("fe80::1:", None, ("fe80::1:",)),
        ("node0", True, ("HOST:PORT",)),
        ("node0:1", False, ("without a port",)),
        ("[::1]:1", False, ("without a port",)),
        ("h:١٢", None, ("port '١٢'",)),
    ],
)
def test_bad_endpoints_are_one_line(text: str, port: bool | None, words: tuple[str, ...]) -> None:
    from numarun.argtypes import parse_endpoint
    from numarun.errors import UsageError

    with pytest.raises(UsageError) as e:
        parse_endpoint(text, "--rdzv-endpoint", port=port)
    message = str(e.value)
    assert message.startswith("bad --rdzv-endpoint") and "expected" in message and "\n" not in message
    assert all(w in message for w in words), message


# ----------------------------------------------------------------------------- the rule (pure)

OWN = {
    "127.0.0.1": "lo",
    "::1": "lo",
    "10.1.0.5": "eth0",
    "fe80::5": "eth0",
    "192.168.9.9": "eth1",
    "fd00::9": "eth1",
    "169.254.3.3": "eth2",
}


@pytest.mark.parametrize(
    "multi, endpoint, addrs, own, route, prefer, expected",
    [
        (False, "node0", ("10.1.0.5",), OWN, None, (), "127.0.0.1"),  # one node: loopback, whatever the names
        (False, "::1", ("::1",), OWN, None, (), "::1"),
        (True, "127.0.0.1", ("127.0.0.1",), OWN, None, (), "127.0.0.1"),  # every node on this host
        (True, "localhost", (), OWN, None, (), "127.0.0.1"),
        (True, "node0", ("10.1.0.1",), OWN, "192.168.9.9", (), "192.168.9.9"),  # the route toward the endpoint
        (True, "node0", ("127.0.1.1",), OWN, "127.0.1.1", (), "10.1.0.5"),  # a name mapped to loopback: not advertised
        (True, "node0", ("127.0.1.1",), OWN, "127.0.1.1", ("eth1",), "192.168.9.9"),  # else the plan's NIC
        (True, "node0", ("fd00::1",), OWN, None, (), "fd00::9"),  # the endpoint's family
        (True, "n", ("10.0.0.1",), {"127.0.0.1": "lo", "169.254.3.3": "eth2", "fe80::5": "eth0"}, None, (), None),
        (True, "n", ("10.0.0.1",), OWN, "10.9.9.9", (), "10.1.0.5"),  # a route through an address not ours is no answer
    ],
)
def test_the_address_rule(multi, endpoint, addrs, own, route, prefer, expected) -> None:
    from numarun.launch.net import choose

    assert (
        choose(multi_node=multi, endpoint=endpoint, endpoint_addrs=addrs, own=own, route=route, prefer=prefer)
        == expected
    )


@pytest.mark.parametrize(
    "host, addrs, expected",
    [
        ("10.1.0.5", ("10.1.0.5",), True),  # node 0's own IP, whatever its hostname resolves to
        ("10.1.0.6", ("10.1.0.6",), False),
        ("node0", ("127.0.1.1",), True),
        ("myhost", ("10.7.7.7",), True),
        ("localhost", (), True),
        ("fe80::5%eth0", ("fe80::5%eth0",), True),
        ("other", ("10.2.2.2", "fd00::2"), False),
    ],
)
def test_who_hosts_the_store_is_read_from_the_interfaces(host: str, addrs: tuple[str, ...], expected: bool) -> None:
    from numarun.launch.net import hosts_endpoint

    assert hosts_endpoint(host, addrs, OWN, "myhost") is expected


@pytest.mark.parametrize(
    "resolved, address, multi, severity, words",
    [
        ((), "10.1.0.5", False, "warn", ("does not resolve", "127.0.0.1", "10.1.0.5 (eth0)", "/etc/hosts")),
        (("127.0.1.1",), "10.1.0.5", True, "warn", ("loopback 127.0.1.1", "c10d store")),
        (("127.0.1.1",), "10.1.0.5", False, "info", ("loopback",)),
        (("10.3.3.3",), "10.1.0.5", False, "warn", ("not an address of this host",)),
        (("10.1.0.5",), "10.1.0.5", True, "info", ("resolves to 10.1.0.5",)),
        (("10.1.0.5",), None, True, "error", ("--local-addr", "--network host")),
        ((), None, False, "warn", ("no address but loopback",)),
    ],
)
def test_doctor_hostname_check(resolved, address, multi, severity, words) -> None:
    from numarun.doctor.checks import check_hostname

    (finding,) = check_hostname("h1", resolved, OWN, address, multi_node=multi)
    assert finding.check == "hostname" and finding.severity.value == severity
    assert all(w in finding.message for w in words), finding.message


# ----------------------------------------------------------------------------- the rule applied (no process)


def _spec(*argv: str):
    from numarun.cli import build_parser
    from numarun.commands.run import target_of
    from numarun.launch.spec import launch_spec
    from numarun.options.launch import from_args

    ns = build_parser(only="run").parse_args(["run", *argv, str(SCRIPTS / "exit_rank.py")])
    return launch_spec(from_args(ns, {}), nproc_per_node=1, target=target_of(ns))


def _usable_own() -> str:
    from numarun.launch.net import own_addresses, usable

    addr = next((a for a in own_addresses() if usable(a) and ":" not in a), None)
    if addr is None:
        pytest.skip("this host has no IPv4 address but loopback or link-local")
    return addr


def test_ipv6_forms_reach_torchrun_in_brackets() -> None:
    if not _v6_loopback():
        pytest.skip("no IPv6 loopback here")
    spec = _spec("--rdzv-backend", "c10d", "--rdzv-endpoint", "[::1]:29500", "--nnodes", "2")
    assert (
        "--rdzv-endpoint=[::1]:29500" in spec.argv() and spec.local_addr == "::1" and spec.endpoint() == ("::1", 29500)
    )
    assert spec.endpoint_text() == "[::1]:29500"
    spec = _spec("--rdzv-backend", "c10d", "--rdzv-endpoint", "::1")  # bare: no port, torch's default
    assert "--rdzv-endpoint=[::1]" in spec.argv() and spec.endpoint() == ("::1", 29400)
    for addr in ("::1", "[::1]"):
        spec = _spec("--master-addr", addr, "--master-port", str(free_port()))
        assert spec.master_addr == "::1" and spec.local_addr == "::1"


def test_c10d_is_host_from_the_interfaces() -> None:
    mine = _usable_own()
    port = free_port()
    spec = _spec("--rdzv-backend", "c10d", "--rdzv-endpoint", f"{mine}:{port}", "--nnodes", "2")
    assert dict(spec.rdzv_conf)["is_host"] == "true" and spec.hosts_store and spec.local_addr == mine
    spec = _spec("--rdzv-backend", "c10d", "--rdzv-endpoint", f"198.51.100.7:{port}", "--nnodes", "2")
    assert dict(spec.rdzv_conf)["is_host"] == "false" and not spec.hosts_store
    spec = _spec(
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{mine}:{port}", "--nnodes", "2", "--rdzv-conf", "is_host=0"
    )
    assert dict(spec.rdzv_conf)["is_host"] == "0" and not spec.hosts_store  # the user's value wins
    with socket.socket() as s:  # another agent of this host hosts it already: torch's fallback, made explicit
        s.bind((mine, 0))
        s.listen()
        spec = _spec("--rdzv-backend", "c10d", "--rdzv-endpoint", f"{mine}:{s.getsockname()[1]}", "--nnodes", "2")
    assert dict(spec.rdzv_conf)["is_host"] == "false"
    # loopback or this hostname: torch's own test is right, and keeps its fallback
    assert "is_host" not in dict(
        _spec("--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--nnodes", "2").rdzv_conf
    )


def test_user_local_addr_wins_and_gloo_follows_the_address() -> None:
    mine = _usable_own()
    spec = _spec(
        "--local-addr", mine, "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--nnodes", "2"
    )
    from numarun.launch.net import own_addresses

    own = own_addresses()
    assert spec.local_addr == mine and dict(spec.env) == {"GLOO_SOCKET_IFNAME": own[mine]}
    assert dict(_spec().env) == {"GLOO_SOCKET_IFNAME": own["127.0.0.1"]}  # one node: loopback's interface


def _doctor_options(*argv: str):  # type: ignore[no-untyped-def]
    from numarun.cli import build_parser
    from numarun.options.launch import from_args

    return from_args(build_parser(only="doctor").parse_args(["doctor", *argv]), {})


def test_doctor_reads_a_bare_ipv6_endpoint() -> None:
    from numarun.doctor.diagnose import rendezvous

    assert rendezvous(_doctor_options("--rdzv-endpoint", "fd00::1")) == ("fd00::1", 29500)  # not host 'fd00:' port 1
    assert rendezvous(_doctor_options("--rdzv-endpoint", "fe80::1%lo")) == ("fe80::1%lo", 29500)
    with pytest.raises(UsageError, match=r"bad --rdzv-endpoint '\[fe80::1\]:7': a link-local address .* \[fe80::1%"):
        rendezvous(_doctor_options("--rdzv-endpoint", "[fe80::1]:7"))  # no interface: nothing could bind or reach it
    assert rendezvous(_doctor_options("--rdzv-endpoint", "[::1]:29511")) == ("::1", 29511)
    assert rendezvous(_doctor_options("--master-addr", "[::1]", "--master-port", "29512")) == ("::1", 29512)
    with pytest.raises(UsageError, match="missing --master-addr"):  # torchrun's 127.0.0.1 is no node's address
        rendezvous(_doctor_options())


def test_an_etcd_rendezvous_waits_quietly_for_its_server() -> None:
    """No node of the job hosts an etcd server: every node waits for it to listen, quietly, as for another
    node's c10d store (torch's client would retry aloud), one node too; torch's default port, 2379."""
    port = free_port()
    for backend in ("etcd", "etcd-v2"):
        spec = _spec("--rdzv-backend", backend, "--rdzv-endpoint", f"127.0.0.1:{port}", "--nnodes", "2")
        assert not spec.hosts_store and spec.waits_for_store, backend
        spec = _spec("--rdzv-backend", backend, "--rdzv-endpoint", "127.0.0.1")
        assert spec.waits_for_store and spec.endpoint() == ("127.0.0.1", 2379), backend
    assert not _spec("--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}").waits_for_store  # it hosts


def _link_local() -> tuple[str, str]:
    import psutil

    for name, addrs in psutil.net_if_addrs().items():
        for a in addrs:
            if a.family == socket.AF_INET6 and a.address.startswith("fe80:"):
                return a.address.partition("%")[0], name
    pytest.skip("no interface here has an IPv6 link-local address")


def test_the_doctor_binds_and_streams_to_a_scoped_link_local_address() -> None:
    """``fe80::1%eth0``: a link-local address is an address only with its interface; the doctor's stream
    server binds with the scope, and names it to the peers."""
    from numarun.doctor.multinode import TcpLink, _stream_to
    from numarun.launch.net import sockaddr

    addr, ifname = _link_local()
    family, bound = sockaddr(f"{addr}%{ifname}", 0)
    assert family == socket.AF_INET6 and bound[3] == socket.if_nametoindex(ifname)
    link = TcpLink(f"{addr}%{ifname}", 0, 0.05)
    link.start()
    try:
        assert link.address.startswith(f"[{addr}%{ifname}]:")
        _stream_to(link.address, 1, 0.05)
        assert link.received.get(1, 0) > 0
    finally:
        link.close()


def test_a_socket_name_gives_its_address_with_the_scope() -> None:
    """An IPv6 socket's ``getsockname()`` carries the scope as an interface index (element 3), never as
    ``%eth0`` in the address: a link-local address is written back with its interface's name."""
    from numarun.launch.net import scoped_address

    index, name = socket.if_nameindex()[0]  # a real interface of this host (lo at least)
    assert scoped_address(("fe80::1", 5, 0, index)) == f"fe80::1%{name}"
    assert scoped_address(("fe80::1", 5, 0, 0)) == "fe80::1"  # no scope
    assert scoped_address(("fd00::9", 5, 0, 0)) == "fd00::9"
    assert scoped_address(("10.0.0.1", 5)) == "10.0.0.1"
    gone = max(i for i, _ in socket.if_nameindex()) + 1000  # no such interface: the index, which getaddrinfo takes
    assert scoped_address(("fe80::1", 5, 0, gone)) == f"fe80::1%{gone}"


# ----------------------------------------------------------------------------- real jobs


def _root(*tools: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root for namespaces (unshare, ip netns)")
    missing = [t for t in tools if not shutil.which(t)]
    if missing:
        pytest.skip(f"needs {', '.join(missing)}")


def _hello(tmp_path: Path) -> Path:
    script = tmp_path / "hello.py"
    script.write_text(HELLO)
    return script


@pytest.mark.slow
@pytest.mark.parametrize("extra", [(), ("--standalone",)], ids=["static", "standalone"])
def test_a_hostname_that_resolves_to_nothing_does_not_hang(extra: tuple[str, ...], tmp_path: Path) -> None:
    """torchrun retries "The IPv6 network addresses of (<host>, <port>) cannot be retrieved" here until killed."""
    _root("unshare", "getent")
    hello = _hello(tmp_path)
    argv = " ".join([*numarun_cmd(), "--nproc-per-node", "2", *extra, str(hello)])
    r = subprocess.run(
        ["unshare", "--uts", "sh", "-c", f"hostname {NORES} && ! getent hosts {NORES} && exec {argv}"],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert sorted(r.stdout.splitlines()) == ["rank 0 sum 2", "rank 1 sum 2"], r.stdout
    assert "cannot be retrieved" not in r.stderr and "Unable to resolve hostname" not in r.stderr, r.stderr[-3000:]


@pytest.mark.slow
def test_an_unresolvable_master_addr_is_one_line(tmp_path: Path) -> None:
    r = subprocess.run(
        [
            *numarun_cmd(),
            "--master-addr",
            "no-such-host.invalid",
            "--nnodes",
            "2",
            "--nproc-per-node",
            "1",
            str(_hello(tmp_path)),
        ],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr[-3000:]
    assert "'no-such-host.invalid'" in r.stderr and "/etc/hosts" in r.stderr


@pytest.mark.slow
def test_an_endpoint_that_refuses_is_one_line_at_the_deadline(tmp_path: Path) -> None:
    """Node 1 of a static rendezvous whose node 0 never comes: no C++ retries, one line naming the endpoint."""
    port = free_port()
    r = subprocess.run(
        [
            *numarun_cmd(),
            "--nnodes",
            "2",
            "--node-rank",
            "1",
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(port),
            "--rdzv-conf",
            "timeout=3",
            "--nproc-per-node",
            "1",
            str(_hello(tmp_path)),
        ],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert r.returncode == 2, r.stderr[-3000:]
    assert error_lines(r.stderr) == [ln for ln in r.stderr.splitlines() if ln.strip()], r.stderr[-3000:]
    assert f"'127.0.0.1:{port}'" in r.stderr and "timeout=3" in r.stderr and "TCPStore" not in r.stderr


def _nodes(
    tmp_path: Path, argv_for: list[list[str]], prefix: list[list[str]] | None = None
) -> list[subprocess.CompletedProcess]:
    procs = []
    for i, argv in enumerate(argv_for):
        out, err = open(tmp_path / f"n{i}.out", "w"), open(tmp_path / f"n{i}.err", "w")
        procs.append(
            (
                subprocess.Popen(
                    [*(prefix[i] if prefix else []), *argv], stdout=out, stderr=err, env=clean_env(), cwd=tmp_path
                ),
                out,
                err,
            )
        )
    done = []
    for i, (p, out, err) in enumerate(procs):
        try:
            p.wait(timeout=240)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
            out.close()
            err.close()
        done.append(
            subprocess.CompletedProcess(
                p.args, p.returncode, (tmp_path / f"n{i}.out").read_text(), (tmp_path / f"n{i}.err").read_text()
            )
        )
    return done


@pytest.mark.slow
def test_nodes_whose_hostname_maps_to_loopback_meet_at_node0s_ip(tmp_path: Path) -> None:
    """Debian's /etc/hosts maps the hostname to 127.0.1.1: torchrun then lets no node host the c10d store
    at node 0's own IP, and both nodes fail after a minute of retries."""
    _root("unshare", "nsenter", "ip", "tc", "mount")
    from netns import namespace_nodes

    names = ["numarun-net-n0", "numarun-net-n1"]
    with namespace_nodes(names, "numarun-net-br", "10.77.31", slow_node=None) as addrs:
        hello, port = _hello(tmp_path), free_port()
        prefix, argvs = [], []
        for i, ns in enumerate(names):
            hosts = tmp_path / f"hosts{i}"
            hosts.write_text(f"127.0.0.1 localhost\n127.0.1.1 node{i}\n")
            prefix.append(
                [
                    "nsenter",
                    f"--net=/run/netns/{ns}",
                    "unshare",
                    "--mount",
                    "--uts",
                    "--propagation",
                    "private",
                    "sh",
                    "-c",
                    f'mount --bind {hosts} /etc/hosts && hostname node{i} && exec "$@"',
                    "sh",
                ]
            )
            argvs.append(
                [
                    *numarun_cmd(),
                    "--nnodes",
                    "2",
                    "--nproc-per-node",
                    "1",
                    "--rdzv-backend",
                    "c10d",
                    "--rdzv-endpoint",
                    f"{addrs[0]}:{port}",
                    "--rdzv-id",
                    "net",
                    str(hello),
                ]
            )
        results = _nodes(tmp_path, argvs, prefix)
    for r in results:
        assert r.returncode == 0, r.stderr[-3000:]
    assert sorted(line for r in results for line in r.stdout.splitlines()) == ["rank 0 sum 2", "rank 1 sum 2"]


@pytest.mark.slow
def test_ipv6_loopback_end_to_end_for_run_and_doctor(tmp_path: Path) -> None:
    if not _v6_loopback():
        pytest.skip("no IPv6 loopback here")
    hello, port = _hello(tmp_path), free_port()
    run = [
        *numarun_cmd(),
        "--nnodes",
        "2",
        "--nproc-per-node",
        "1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"[::1]:{port}",
        "--rdzv-id",
        "v6",
        str(hello),
    ]
    results = _nodes(tmp_path, [run, run])
    assert all(r.returncode == 0 for r in results), [r.stderr[-2000:] for r in results]
    assert sorted(line for r in results for line in r.stdout.splitlines()) == ["rank 0 sum 2", "rank 1 sum 2"]
    doctor = [
        *numarun_cmd(),
        "doctor",
        "--json",
        "--no-measure",
        "--nnodes",
        "2",
        "--rdzv-endpoint",
        f"[::1]:{free_port()}",
        "--doctor-timeout",
        "120",
        "--link-seconds",
        "0.2",
    ]
    results = _nodes(tmp_path, [[*doctor, "--node-rank", "0"], [*doctor, "--node-rank", "1"]])
    assert [r.returncode for r in results] == [0, 0], [r.stderr[-2000:] for r in results]


@pytest.mark.slow
def test_doctor_on_a_scoped_link_local_endpoint_with_both_node_ranks_here(tmp_path: Path) -> None:
    """``numarun doctor --rdzv-endpoint '[fe80::...%eth0]:PORT'``, both node ranks on this host: each node's stream
    server binds to the scoped address it reaches node 0 from, the streams meet, and a link-local endpoint
    without its interface is one line, exit 2."""
    addr, ifname = _link_local()
    doctor = [*numarun_cmd(), "doctor", "--json", "--no-measure", "--nnodes", "2", "--doctor-timeout", "120"]
    endpoint = ["--rdzv-endpoint", f"[{addr}%{ifname}]:{free_port()}", "--link-seconds", "0.2"]
    results = _nodes(tmp_path, [[*doctor, *endpoint, "--node-rank", str(rank)] for rank in (0, 1)])
    assert [r.returncode for r in results] == [0, 0], [r.stderr[-2000:] for r in results]
    head = json.loads(results[0].stdout)
    assert sorted(n["node_rank"] for n in head["nodes"]) == [0, 1]
    assert all(n["figures"]["link_gbs"] > 0 for n in head["nodes"]), head["nodes"]
    bad = subprocess.run(
        [*doctor, "--node-rank", "0", "--rdzv-endpoint", f"[{addr}]:{free_port()}"],
        capture_output=True,
        text=True,
        env=clean_env(),
        cwd=tmp_path,
        timeout=120,
    )
    assert bad.returncode == 2 and "Traceback" not in bad.stderr, bad.stderr[-2000:]
    (line,) = error_lines(bad.stderr)
    assert f"'[{addr}]:" in line and "expected" in line, line
