"""The file-based IPAM shared by the bash and native bridge plugins (netplugin.plugins.bridge.ipam).

No root needed: the IPAM is files and a flock. Where the bash plugin can act on the IPAM without
root (its teardown only releases when the host veth does not exist) the tests run it for real, to
prove both implementations agree on the format and the lock.
"""

from __future__ import annotations

import fcntl
import ipaddress
import multiprocessing
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from netplugin.core.errors import InvalidArgument
from netplugin.plugins.bridge import ipam as ipam_module
from netplugin.plugins.bridge import ipam_files
from netplugin.plugins.bridge.ipam import (
    IPAM,
    AddressesExhausted,
    Allocation,
    CorruptRecord,
    IPAMError,
    SubnetMismatch,
    pool_bounds,
)
from netplugin.plugins.bridge.podipam import PodIPAM

REPO = Path(__file__).resolve().parents[3]
BASH_BRIDGE = REPO / "exec_plugins" / "bridge" / "bridge"


def files(d: Path, sub: str) -> dict[str, str]:
    p = d / sub
    return {f.name: f.read_text() for f in sorted(p.iterdir())} if p.is_dir() else {}


@pytest.fixture
def ipam_dir(tmp_path: Path) -> Path:
    return tmp_path / "bridge" / "cbr0"


# --- format and basic behaviour ---------------------------------------------------------------------


def test_allocation_writes_the_documented_files(ipam_dir: Path) -> None:
    ipam = IPAM(str(ipam_dir), "10.204.7.0/24")
    assert ipam.allocate("abc123", "default", "web-0") == ("10.204.7.2", 24)  # .1 is the gateway
    assert ipam.allocate("def456", "team-a", "db.x") == ("10.204.7.3", 24)
    assert (ipam_dir / "subnet").read_text() == "10.204.7.0/24\n"
    assert (ipam_dir / "cursor").read_text() == "10.204.7.3\n"
    assert files(ipam_dir, "ips") == {"10.204.7.2": "abc123\n", "10.204.7.3": "def456\n"}
    assert files(ipam_dir, "pods") == {
        "abc123": "10.204.7.2/24 default web-0\n",
        "def456": "10.204.7.3/24 team-a db.x\n",
    }
    assert (ipam_dir / "lock").exists()
    # No temp files are left behind.
    assert sorted(os.listdir(ipam_dir)) == ["cursor", "ips", "lock", "pods", "subnet"]


def test_same_pod_gets_the_same_address(ipam_dir: Path) -> None:
    ipam = IPAM(str(ipam_dir), "10.204.7.0/24")
    first = ipam.allocate("abc123", "default", "web-0")
    ipam.allocate("other", "default", "web-1")
    assert ipam.allocate("abc123", "default", "web-0") == first
    assert ipam.claim("abc123", "default", "web-0") == (
        Allocation("abc123", "10.204.7.2", 24, "default", "web-0"),
        False,
    )
    assert len(files(ipam_dir, "ips")) == 2


def test_release_frees_the_address_and_is_idempotent(ipam_dir: Path) -> None:
    ipam = IPAM(str(ipam_dir), "10.204.7.0/24")
    ip, _ = ipam.allocate("abc123", "default", "web-0")
    ipam.allocate("keep", "default", "web-1")
    assert ipam.release("abc123") == ip
    assert ipam.lookup("abc123") is None
    assert ip not in files(ipam_dir, "ips")
    assert "abc123" not in files(ipam_dir, "pods")
    assert ipam.release("abc123") is None
    assert ipam.release("never-allocated") is None
    assert [a.infra_id for a in ipam.list()] == ["keep"]


def test_gateway_network_and_broadcast_are_never_handed_out(ipam_dir: Path) -> None:
    ipam = IPAM(str(ipam_dir), "10.204.7.0/29", gateway="10.204.7.4")
    got = {ipam.allocate(f"p{i}", "default", f"pod-{i}")[0] for i in range(5)}
    assert got == {"10.204.7.1", "10.204.7.2", "10.204.7.3", "10.204.7.5", "10.204.7.6"}


def test_allocation_is_round_robin_and_the_cursor_wraps(ipam_dir: Path) -> None:
    ipam = IPAM(str(ipam_dir), "10.204.7.0/29")  # pods: .2-.6
    for i in range(5):
        ipam.allocate(f"p{i}", "default", f"pod-{i}")
    ipam.release("p1")  # frees .3
    ipam.release("p3")  # frees .5
    # The cursor is at .6: the next probe wraps to .1 (gateway, skipped), .2 (taken), then .3.
    assert ipam.allocate("n1", "default", "new-1")[0] == "10.204.7.3"
    assert ipam.allocate("n2", "default", "new-2")[0] == "10.204.7.5"
    # A just-freed address is reused last.
    ipam.release("n1")
    ipam.release("p4")  # .6
    assert ipam.allocate("n3", "default", "new-3")[0] == "10.204.7.6"


def test_a_cursor_rewritten_in_place_has_exactly_its_new_content(ipam_dir: Path) -> None:
    # Never truncated to zero (on ext4 that flushes the file on close), never replaced by a rename.
    ipam = IPAM(str(ipam_dir), "10.204.7.0/24")
    ipam_dir.mkdir(parents=True)
    (ipam_dir / "cursor").write_text("10.204.7.254\n")  # the pool's last address: the next probe wraps
    inode = (ipam_dir / "cursor").stat().st_ino
    assert ipam.allocate("p0", "default", "pod-0")[0] == "10.204.7.2"
    assert (ipam_dir / "cursor").read_text() == "10.204.7.2\n"  # shorter than before: the old tail is cut
    assert (ipam_dir / "cursor").stat().st_ino == inode


@pytest.mark.parametrize(
    "torn",
    [
        "10.204.7.2\n54\n",  # killed between the write of .2 over .254 and the cut
        "10.204.7.3\n\n",  # the same over a longer address, the tail is a newline
        "10.204.7.",
        "",
    ],
)
def test_a_torn_cursor_never_hands_out_an_address_twice(ipam_dir: Path, torn: str) -> None:
    ipam = IPAM(str(ipam_dir), "10.204.7.0/24")
    taken = [ipam.allocate(f"p{i}", "default", f"pod-{i}")[0] for i in range(3)]  # .2, .3, .4
    (ipam_dir / "cursor").write_text(torn)
    got = [ipam.allocate(f"n{i}", "default", f"new-{i}")[0] for i in range(2)]
    assert not set(got) & set(taken) and len(set(got)) == 2
    owners = ipam.allocated_ips()
    assert sorted(owners.values()) == ["n0", "n1", "p0", "p1", "p2"]
    assert all(ipam.lookup(owner).ip == ip for ip, owner in owners.items())  # type: ignore[union-attr]


def _page_cache(path: Path) -> tuple[int, int]:
    """(pages cached, pages dirty) of a file: cachestat(2), Linux 6.5+ (x86_64 syscall 451)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    rng = (ctypes.c_uint64 * 2)(0, 0)  # offset 0, length 0: the whole file
    out = (ctypes.c_uint64 * 5)()  # nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted
    fd = os.open(path, os.O_RDONLY)
    try:
        assert libc.syscall(451, fd, ctypes.byref(rng), ctypes.byref(out), 0) == 0, os.strerror(ctypes.get_errno())
    finally:
        os.close(fd)
    return int(out[0]), int(out[1])


def test_a_new_allocation_starts_writing_its_records_out(ipam_dir: Path) -> None:
    # Left dirty, the records of a burst of setups are written back together ~30 s later, and every
    # journal commit (the next pod's fsync) waits for that pile. Whether the page is still cached
    # afterwards is the kernel's race (fadvise drops a page whose writeback has already finished),
    # so only "no longer dirty" is the contract.
    ipam = IPAM(str(ipam_dir), "10.204.7.0/24")
    ip, _ = ipam.allocate("abc123", "default", "web")
    for record in (ipam_dir / "pods" / "abc123", ipam_dir / "ips" / ip):
        assert _page_cache(record)[1] == 0, record


def test_the_page_cache_probe_sees_a_dirty_page(ipam_dir: Path) -> None:
    # The probe above must be able to fail: a file written without a writeback hint stays dirty.
    ipam_dir.mkdir(parents=True)
    plain = ipam_dir / "plain"
    plain.write_text("10.204.7.9\n")
    assert _page_cache(plain) == (1, 1)


def test_exhaustion_is_a_clear_error_and_changes_nothing(ipam_dir: Path) -> None:
    ipam = IPAM(str(ipam_dir), "10.204.7.0/29")
    for i in range(5):
        ipam.allocate(f"p{i}", "default", f"pod-{i}")
    before = (files(ipam_dir, "ips"), files(ipam_dir, "pods"), (ipam_dir / "cursor").read_text())
    with pytest.raises(AddressesExhausted) as exc:
        ipam.allocate("late", "default", "late")
    assert "no free address in 10.204.7.0/29" in str(exc.value)
    assert "(all 5 pod addresses are allocated" in str(exc.value)
    assert (files(ipam_dir, "ips"), files(ipam_dir, "pods"), (ipam_dir / "cursor").read_text()) == before
    ipam.release("p2")
    assert ipam.allocate("late", "default", "late")[0] == "10.204.7.4"


def test_exhaustion_of_a_larger_subnet_lists_the_directory_once(
    ipam_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Past the first probes the IPAM reads ips/ in one listing: a full /22 costs a few dozen
    # lookups and one listing, not a thousand lookups.
    ipam = IPAM(str(ipam_dir), "10.204.0.0/22")
    (ipam_dir / "ips").mkdir(parents=True)
    for n in range(2, 1022):
        (ipam_dir / "ips" / str(ipaddress.IPv4Address(int(ipaddress.IPv4Address("10.204.0.0")) + n))).write_text("x\n")
    assert ipam.allocate("last", "default", "last")[0] == "10.204.3.254"
    calls = {"lexists": 0, "listdir": 0}

    def counted(name: str, real: Callable[[str], object]) -> Callable[[str], object]:
        def call(path: str) -> object:
            if os.fspath(path).startswith(str(ipam_dir / "ips")):
                calls[name] += 1
            return real(path)

        return call

    monkeypatch.setattr(os.path, "lexists", counted("lexists", os.path.lexists))
    monkeypatch.setattr(ipam_module, "listdir", counted("listdir", ipam_files.listdir))
    with pytest.raises(AddressesExhausted):
        ipam.allocate("one-more", "default", "one-more")
    assert calls["listdir"] == 1
    assert 0 < calls["lexists"] <= ipam_module._PROBE_BEFORE_LISTING


def test_refuses_a_directory_of_another_subnet(ipam_dir: Path) -> None:
    IPAM(str(ipam_dir), "10.204.7.0/24").allocate("abc", "default", "web")
    other = IPAM(str(ipam_dir), "10.204.8.0/24")
    for call in (
        lambda: other.allocate("x", "default", "x"),
        lambda: other.release("abc"),
        lambda: other.lookup("abc"),
    ):
        with pytest.raises(SubnetMismatch) as exc:
            call()
        assert str(ipam_dir) in str(exc.value)
        assert "10.204.7.0/24" in str(exc.value) and "10.204.8.0/24" in str(exc.value)
    assert files(ipam_dir, "pods") == {"abc": "10.204.7.2/24 default web\n"}


@pytest.mark.parametrize(
    "subnet, reason",
    [
        ("10.204.7.1/24", "CIDR"), ("10.204.7.0/31", "at most /30"), ("10.0.0.0/7", "at least /8"),
        ("fd00::/40", "at least /48"), ("fd00::/127", "at most /126"), ("fd00::1/64", "CIDR"),
    ],
)
def test_rejects_unusable_subnets(ipam_dir: Path, subnet: str, reason: str) -> None:
    with pytest.raises(InvalidArgument) as exc:
        IPAM(str(ipam_dir), subnet)
    assert reason in str(exc.value)


@pytest.mark.parametrize("gateway", ["10.204.8.1", "10.204.7.0", "10.204.7.255", "gw"])
def test_rejects_a_gateway_outside_the_subnet(ipam_dir: Path, gateway: str) -> None:
    with pytest.raises(InvalidArgument):
        IPAM(str(ipam_dir), "10.204.7.0/24", gateway=gateway)


@pytest.mark.parametrize("infra_id", ["../evil", ".hidden", "a/b", "", "x" * 257])
def test_infra_ids_that_are_not_file_names_are_rejected(ipam_dir: Path, infra_id: str) -> None:
    ipam = IPAM(str(ipam_dir), "10.204.7.0/24")
    with pytest.raises(InvalidArgument):
        ipam.allocate(infra_id, "default", "web")
    with pytest.raises(InvalidArgument):
        ipam.release(infra_id)
    assert not (ipam_dir.parent / "evil").exists()


# --- damaged state ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content",
    [
        "",
        "10.204.7.9/24 default\n",
        "garbage\n",
        "10.204.8.9/24 default web\n",
        "10.204.7.9/16 default web\n",
        "10.204.7.1/24 default web\n",
        "10.204.7.9/24 default web\nextra\n",
        "10.204.7.9/24 default web",
    ],
)
def test_a_corrupt_pod_record_is_an_error_naming_the_file(ipam_dir: Path, content: str) -> None:
    ipam = IPAM(str(ipam_dir), "10.204.7.0/24")
    ipam.allocate("other", "default", "other")
    record = ipam_dir / "pods" / "abc123"
    record.write_text(content)
    for call in (lambda: ipam.allocate("abc123", "default", "web"), lambda: ipam.lookup("abc123"), ipam.list):
        with pytest.raises(CorruptRecord) as exc:
            call()
        assert str(record) in str(exc.value)
    assert record.read_text() == content  # never "repaired" by guessing


def test_release_of_a_corrupt_record_cleans_up_by_scanning(ipam_dir: Path) -> None:
    ipam = IPAM(str(ipam_dir), "10.204.7.0/24")
    ip, _ = ipam.allocate("abc123", "default", "web")
    ipam.allocate("other", "default", "other")
    (ipam_dir / "pods" / "abc123").write_text("")  # torn by a crash
    assert ipam.release("abc123") is None
    assert ip not in files(ipam_dir, "ips")
    assert "abc123" not in files(ipam_dir, "pods")
    assert [a.infra_id for a in ipam.list()] == ["other"]
    assert ipam.allocate("abc123", "default", "web")[0] != ip  # usable again, round robin


def test_an_interrupted_allocation_is_completed_by_the_retry(ipam_dir: Path) -> None:
    # Crash between writing pods/<id> and ips/<addr>: the pod record wins.
    ipam = IPAM(str(ipam_dir), "10.204.7.0/24")
    ip, _ = ipam.allocate("abc123", "default", "web")
    (ipam_dir / "ips" / ip).unlink()
    assert ipam.allocate("abc123", "default", "web")[0] == ip
    assert (ipam_dir / "ips" / ip).read_text() == "abc123\n"
    # A torn address file of that pod is rewritten too.
    (ipam_dir / "ips" / ip).write_text("")
    assert ipam.allocate("abc123", "default", "web")[0] == ip
    assert (ipam_dir / "ips" / ip).read_text() == "abc123\n"


def test_records_that_disagree_are_an_error(ipam_dir: Path) -> None:
    ipam = IPAM(str(ipam_dir), "10.204.7.0/24")
    ip, _ = ipam.allocate("abc123", "default", "web")
    (ipam_dir / "ips" / ip).write_text("someone-else\n")
    with pytest.raises(CorruptRecord) as exc:
        ipam.allocate("abc123", "default", "web")
    assert str(ipam_dir / "ips" / ip) in str(exc.value)
    # Release leaves another pod's address file alone, but drops this pod's record.
    assert ipam.release("abc123") == ip
    assert (ipam_dir / "ips" / ip).read_text() == "someone-else\n"
    assert "abc123" not in files(ipam_dir, "pods")


def test_torn_address_files_are_never_handed_out(ipam_dir: Path) -> None:
    ipam = IPAM(str(ipam_dir), "10.204.7.0/24")
    (ipam_dir / "ips").mkdir(parents=True)
    (ipam_dir / "ips" / "10.204.7.2").write_text("")
    assert ipam.allocate("abc123", "default", "web")[0] == "10.204.7.3"
    assert ipam.allocated_ips() == {"10.204.7.2": "", "10.204.7.3": "abc123"}


@pytest.mark.parametrize("cursor", ["", "junk", "10.9.9.9", "10.204.7.255", "10.204.7.0"])
def test_a_bad_cursor_restarts_from_the_first_address(ipam_dir: Path, cursor: str) -> None:
    ipam = IPAM(str(ipam_dir), "10.204.7.0/24")
    ipam_dir.mkdir(parents=True)
    (ipam_dir / "cursor").write_text(cursor)
    assert ipam.allocate("abc123", "default", "web")[0] == "10.204.7.2"


def test_a_removed_directory_is_created_again(ipam_dir: Path) -> None:
    ipam = IPAM(str(ipam_dir), "10.204.7.0/24")
    ipam.allocate("abc123", "default", "web")
    subprocess.run(["rm", "-rf", str(ipam_dir)], check=True)
    assert ipam.allocate("def456", "default", "web2")[0] == "10.204.7.2"


def test_a_held_lock_times_out_with_the_lock_path(ipam_dir: Path) -> None:
    ipam = IPAM(str(ipam_dir), "10.204.7.0/24", lock_timeout=0.3)
    ipam.allocate("abc123", "default", "web")
    # Another process holds the lock (as the bash plugin would, with flock(1)).
    holder = subprocess.Popen(
        ["flock", str(ipam_dir / "lock"), "sleep", "30"], stdin=subprocess.DEVNULL, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            fd = os.open(ipam_dir / "lock", os.O_RDWR)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                break  # the holder has it
            finally:
                os.close(fd)
            assert time.monotonic() < deadline
            time.sleep(0.01)
        t0 = time.monotonic()
        with pytest.raises(IPAMError) as exc:
            ipam.allocate("def456", "default", "web2")
        assert 0.25 < time.monotonic() - t0 < 3
        assert str(ipam_dir / "lock") in str(exc.value)
    finally:
        os.killpg(holder.pid, signal.SIGKILL)  # flock and the sleep that inherited the locked fd
        holder.wait()
    assert ipam.allocate("def456", "default", "web2")[0] == "10.204.7.3"


# --- concurrency -----------------------------------------------------------------------------------------


def _allocate_many(directory: str, worker: int, count: int, release_every: int) -> list[tuple[str, str]]:
    ipam = IPAM(directory, "10.204.0.0/22")
    got = []
    for i in range(count):
        infra = f"w{worker}p{i}"
        ip, _ = ipam.allocate(infra, "default", f"pod-{worker}-{i}")
        got.append((infra, ip))
        if release_every and i % release_every == release_every - 1:
            ipam.release(infra)
            got.pop()
    return got


def test_no_duplicates_under_concurrent_allocation_from_processes(ipam_dir: Path) -> None:
    workers, count = 8, 40
    ctx = multiprocessing.get_context("spawn")  # fresh interpreters: nothing shared but the files
    with ctx.Pool(workers) as pool:
        results = pool.starmap(_allocate_many, [(str(ipam_dir), w, count, 5) for w in range(workers)])
    held = [pair for r in results for pair in r]
    ips = [ip for _, ip in held]
    assert len(ips) == len(set(ips)) == workers * (count - count // 5)
    assert files(ipam_dir, "ips") == {ip: f"{infra}\n" for infra, ip in held}
    assert sorted(files(ipam_dir, "pods")) == sorted(infra for infra, _ in held)


def test_no_duplicates_under_concurrent_allocation_from_threads(ipam_dir: Path) -> None:
    ipam = IPAM(str(ipam_dir), "10.204.7.0/24")
    barrier = threading.Barrier(16)

    def one(i: int) -> str:
        barrier.wait()
        return ipam.allocate(f"t{i}", "default", f"pod-{i}")[0]

    with ThreadPoolExecutor(16) as ex:
        ips = list(ex.map(one, range(16)))
    assert len(set(ips)) == 16
    assert sorted(files(ipam_dir, "ips")) == sorted(ips)


# --- interop with the bash plugin's IPAM -----------------------------------------------------------------


def _bash_env(tmp_path: Path, ipam_dir: Path, subnet: str, infra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NETPLUGIN_")}
    env.update(
        NETPLUGIN_STATE_DIR=str(tmp_path / "np-state"),
        NETPLUGIN_BRIDGE_STATE_DIR=str(ipam_dir.parent),
        NETPLUGIN_BRIDGE_NAME=ipam_dir.name,
        NETPLUGIN_BRIDGE_SUBNET=subnet,
        NETPLUGIN_BRIDGE_IP_FORWARD="false",
        NETPLUGIN_BRIDGE_BR_NETFILTER="false",
        NETPLUGIN_ACTION="teardown",
        NETPLUGIN_INFRA_ID=infra,
        NETPLUGIN_NETNS=f"/var/run/netns/{infra}",
    )
    return env


needs_bash_plugin = pytest.mark.skipif(not BASH_BRIDGE.exists(), reason="exec_plugins/bridge/bridge is missing")


def _bash_teardown(tmp_path: Path, ipam_dir: Path, subnet: str, infra: str) -> subprocess.Popen[str]:
    # With no host veth of that name, the bash teardown only releases the address: no root needed.
    return subprocess.Popen(
        [str(BASH_BRIDGE), "teardown", "default", "web", infra],
        env=_bash_env(tmp_path, ipam_dir, subnet, infra),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@needs_bash_plugin
def test_bash_plugin_releases_what_python_allocated(tmp_path: Path) -> None:
    ipam_dir = tmp_path / "bridge" / "npbrtest"
    ipam = IPAM(str(ipam_dir), "10.204.9.0/24")
    ip, _ = ipam.allocate("npinfra1", "default", "web")
    ipam.allocate("npinfra2", "default", "web2")
    p = _bash_teardown(tmp_path, ipam_dir, "10.204.9.0/24", "npinfra1")
    _, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
    assert ipam.lookup("npinfra1") is None
    assert ip not in files(ipam_dir, "ips")
    assert [a.infra_id for a in ipam.list()] == ["npinfra2"]


@needs_bash_plugin
def test_bash_and_python_share_the_lock(tmp_path: Path) -> None:
    # Python allocates while 30 bash processes release other pods at the same time: every record
    # must stay consistent (a lost update would leave an orphan file or drop a live record).
    ipam_dir = tmp_path / "bridge" / "npbrtest"
    subnet = "10.204.9.0/24"
    ipam = IPAM(str(ipam_dir), subnet)
    doomed = [f"old{i}" for i in range(30)]
    for infra in doomed:
        ipam.allocate(infra, "default", "web")
    procs = [_bash_teardown(tmp_path, ipam_dir, subnet, infra) for infra in doomed]
    fresh = [ipam.allocate(f"new{i}", "default", "web")[0] for i in range(60)]
    for p in procs:
        _, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
    assert len(set(fresh)) == 60
    assert files(ipam_dir, "ips") == {ip: f"new{i}\n" for i, ip in enumerate(fresh)}
    assert sorted(files(ipam_dir, "pods")) == sorted(f"new{i}" for i in range(60))


@needs_bash_plugin
def test_python_refuses_a_directory_bash_created_for_another_subnet(tmp_path: Path) -> None:
    ipam_dir = tmp_path / "bridge" / "npbrtest"
    # The bash teardown of an unknown pod creates nothing; a python allocation creates the dir.
    IPAM(str(ipam_dir), "10.204.9.0/24").allocate("a", "default", "web")
    assert (ipam_dir / "subnet").read_text() == "10.204.9.0/24\n"
    with pytest.raises(SubnetMismatch):
        IPAM(str(ipam_dir), "10.204.10.0/24").allocate("b", "default", "web")


# --- property-based: a model of the IPAM ----------------------------------------------------------------

INFRA_IDS = [f"id{i}" for i in range(9)]


class IPAMMachine(RuleBasedStateMachine):
    """Random allocate/release/lookup sequences on a /28 (13 pod addresses) against a dict model."""

    def __init__(self) -> None:
        super().__init__()
        import tempfile

        self._tmp = tempfile.TemporaryDirectory()
        self.dir = Path(self._tmp.name) / "br"
        self.ipam = IPAM(str(self.dir), "10.204.5.0/28", gateway="10.204.5.7")
        self.model: dict[str, str] = {}
        self.usable = {str(a) for a in ipaddress.IPv4Network("10.204.5.0/28").hosts()} - {"10.204.5.7"}

    def teardown(self) -> None:
        self._tmp.cleanup()

    @rule(infra=st.sampled_from(INFRA_IDS))
    def allocate(self, infra: str) -> None:
        ip, plen = self.ipam.allocate(infra, "default", "web")
        assert plen == 28
        if infra in self.model:
            assert ip == self.model[infra]
        else:
            assert ip in self.usable
            assert ip not in self.model.values()
            self.model[infra] = ip

    @rule(infra=st.sampled_from(INFRA_IDS))
    def release(self, infra: str) -> None:
        assert self.ipam.release(infra) == self.model.pop(infra, None)

    @precondition(lambda self: len(self.model) == 9)
    @rule()
    def full_set_still_allocates_for_known_pods(self) -> None:
        for infra, ip in self.model.items():
            assert self.ipam.allocate(infra, "default", "web")[0] == ip

    @rule(infra=st.sampled_from(INFRA_IDS))
    def lookup(self, infra: str) -> None:
        found = self.ipam.lookup(infra)
        assert (found.ip if found else None) == self.model.get(infra)

    @invariant()
    def files_match_the_model(self) -> None:
        assert files(self.dir, "ips") == {ip: f"{infra}\n" for infra, ip in self.model.items()}
        assert files(self.dir, "pods") == {infra: f"{ip}/28 default web\n" for infra, ip in self.model.items()}


IPAMMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_ipam_model = IPAMMachine.TestCase


class SmallSubnetMachine(RuleBasedStateMachine):
    """On a /29 (5 pod addresses) exhaustion happens exactly when the model is full."""

    def __init__(self) -> None:
        super().__init__()
        import tempfile

        self._tmp = tempfile.TemporaryDirectory()
        self.ipam = IPAM(str(Path(self._tmp.name) / "br"), "10.204.5.0/29")
        self.model: dict[str, str] = {}

    def teardown(self) -> None:
        self._tmp.cleanup()

    @rule(infra=st.sampled_from(INFRA_IDS))
    def allocate(self, infra: str) -> None:
        if infra not in self.model and len(self.model) == 5:
            with pytest.raises(AddressesExhausted):
                self.ipam.allocate(infra, "default", "web")
            return
        ip, _ = self.ipam.allocate(infra, "default", "web")
        assert self.model.setdefault(infra, ip) == ip
        assert len(set(self.model.values())) == len(self.model)

    @rule(infra=st.sampled_from(INFRA_IDS))
    def release(self, infra: str) -> None:
        assert self.ipam.release(infra) == self.model.pop(infra, None)


SmallSubnetMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
test_ipam_exhaustion_model = SmallSubnetMachine.TestCase


# --- IPv6 and dual stack (issue 11) -----------------------------------------------------------------


def test_ipv6_allocation_writes_canonical_files(ipam_dir: Path) -> None:
    ipam = IPAM(str(ipam_dir / "ipv6"), "fd00:10:205:7::/64", lock_path=str(ipam_dir / "lock"))
    assert ipam.allocate("abc123", "default", "web-0") == ("fd00:10:205:7::2", 64)
    assert files(ipam_dir / "ipv6", "ips") == {"fd00:10:205:7::2": "abc123\n"}
    assert files(ipam_dir / "ipv6", "pods") == {"abc123": "fd00:10:205:7::2/64 default web-0\n"}
    assert (ipam_dir / "ipv6" / "subnet").read_text() == "fd00:10:205:7::/64\n"
    assert (ipam_dir / "lock").exists() and not (ipam_dir / "ipv6" / "lock").exists()


@pytest.mark.parametrize(
    ("subnet", "first", "last", "pods"),
    [
        ("fd00:10:205:7::/64", "fd00:10:205:7::1", "fd00:10:205:7::ffff:ffff", (1 << 32) - 2),
        ("fd00:10:205:7::/120", "fd00:10:205:7::1", "fd00:10:205:7::ff", 254),  # no broadcast in IPv6
        ("10.205.7.0/24", "10.205.7.1", "10.205.7.254", 253),
    ],
)
def test_pool_bounds(ipam_dir: Path, subnet: str, first: str, last: str, pods: int) -> None:
    lo, hi = pool_bounds(ipaddress.ip_network(subnet))
    assert (str(ipaddress.ip_address(lo)), str(ipaddress.ip_address(hi))) == (first, last)
    assert IPAM(str(ipam_dir), subnet).pool_size == pods


def test_ipv6_cursor_wraps_and_uses_the_last_address(ipam_dir: Path) -> None:
    ipam = IPAM(str(ipam_dir), "fd00:10:205:7::/126")
    got = [ipam.allocate(f"p{i}", "default", f"p{i}")[0] for i in range(2)]
    assert got == ["fd00:10:205:7::2", "fd00:10:205:7::3"]
    with pytest.raises(AddressesExhausted, match=r"no free address in fd00:10:205:7::/126 \(all 2 pod addresses"):
        ipam.allocate("p2", "default", "p2")
    ipam.release("p0")
    assert ipam.allocate("p2", "default", "p2")[0] == "fd00:10:205:7::2"


def test_ipv6_gateway_outside_the_pool_leaves_every_pool_address_to_pods(ipam_dir: Path) -> None:
    ipam = IPAM(str(ipam_dir), "fd00:10:205:7::/126", "fd00:10:205:7::3")
    assert ipam.pool_size == 2 and [ipam.allocate(f"p{i}", "d", "n")[0] for i in range(2)] == [
        "fd00:10:205:7::1", "fd00:10:205:7::2"]
    far = IPAM(str(ipam_dir / "far"), "fd00:10:205:7::/64", "fd00:10:205:7:1::1")  # beyond ::ffff:ffff
    assert far.pool_size == (1 << 32) - 1
    with pytest.raises(InvalidArgument, match="must be a host address"):
        IPAM(str(ipam_dir), "fd00:10:205:7::/64", "fd00:10:205:7::")
    with pytest.raises(InvalidArgument, match="must be a host address"):
        IPAM(str(ipam_dir), "fd00:10:205:7::/64", "10.205.7.1")


def test_non_canonical_ipv6_record_is_corrupt(ipam_dir: Path) -> None:
    ipam = IPAM(str(ipam_dir), "fd00:10:205:7::/64")
    ipam.allocate("abc", "default", "web")
    (ipam_dir / "pods" / "abc").write_text("fd00:10:205:7:0:0:0:2/64 default web\n")
    with pytest.raises(CorruptRecord, match="canonical form"):
        ipam.lookup("abc")


def _dual(ipam_dir: Path, v6: str = "fd00:10:205:7::/64", v4: str = "10.205.7.0/24") -> PodIPAM:
    return PodIPAM(str(ipam_dir), [ipaddress.ip_network(v4), ipaddress.ip_network(v6)])


def test_pod_ipam_claims_one_address_per_family(ipam_dir: Path) -> None:
    ipam = _dual(ipam_dir)
    allocs, new = ipam.claim("abc", "default", "web")
    assert [a.cidr for a in allocs] == ["10.205.7.2/24", "fd00:10:205:7::2/64"] and new == [4, 6]
    allocs, new = ipam.claim("abc", "default", "web")
    assert [a.ip for a in allocs] == ["10.205.7.2", "fd00:10:205:7::2"] and new == []
    assert [a.ip for a in ipam.lookup("abc")] == ["10.205.7.2", "fd00:10:205:7::2"]
    assert ipam.release("abc") == ["10.205.7.2", "fd00:10:205:7::2"]
    assert ipam.release("abc") == []
    assert files(ipam_dir, "ips") == files(ipam_dir / "ipv6", "ips") == {}


def test_pod_ipam_is_all_or_nothing(ipam_dir: Path) -> None:
    ipam = _dual(ipam_dir, v6="fd00:10:205:7::/126")
    for i in range(2):
        ipam.claim(f"p{i}", "default", f"p{i}")
    with pytest.raises(AddressesExhausted, match="fd00:10:205:7::/126"):
        ipam.claim("p2", "default", "p2")
    assert "p2" not in files(ipam_dir, "pods") and len(files(ipam_dir, "ips")) == 2


def test_pod_ipam_checks_every_subnet_before_allocating(ipam_dir: Path) -> None:
    _dual(ipam_dir).claim("abc", "default", "web")
    moved = _dual(ipam_dir, v6="fd00:10:205:8::/64")
    with pytest.raises(SubnetMismatch, match="fd00:10:205:7::/64"):
        moved.claim("def", "default", "web2")
    assert "def" not in files(ipam_dir, "pods")


def test_pod_ipam_releases_a_family_no_longer_configured(ipam_dir: Path) -> None:
    _dual(ipam_dir).claim("abc", "default", "web")
    v4_only = PodIPAM(str(ipam_dir), [ipaddress.ip_network("10.205.7.0/24")])
    assert v4_only.release("abc") == ["10.205.7.2", "fd00:10:205:7::2"]
    assert files(ipam_dir / "ipv6", "ips") == files(ipam_dir / "ipv6", "pods") == {}


@needs_bash_plugin
def test_bash_plugin_releases_both_families_python_allocated(tmp_path: Path) -> None:
    ipam_dir = tmp_path / "bridge" / "npbrtest"
    ipam = _dual(ipam_dir)
    ipam.claim("npinfra1", "default", "web")
    ipam.claim("npinfra2", "default", "web2")
    p = _bash_teardown(tmp_path, ipam_dir, "10.205.7.0/24,fd00:10:205:7::/64", "npinfra1")
    _, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
    assert ipam.lookup("npinfra1") == []
    assert [a.ip for a in ipam.lookup("npinfra2")] == ["10.205.7.3", "fd00:10:205:7::3"]
    assert sorted(files(ipam_dir / "ipv6", "ips")) == ["fd00:10:205:7::3"]


def test_pod_ipam_no_duplicates_under_concurrent_claims(ipam_dir: Path) -> None:
    ipam = _dual(ipam_dir, v6="fd00:10:205:7::/120")
    with ThreadPoolExecutor(16) as ex:
        got = list(ex.map(lambda i: ipam.claim(f"p{i}", "default", f"p{i}")[0], range(64)))
    for family in (0, 1):
        ips = [allocs[family].ip for allocs in got]
        assert len(set(ips)) == 64
    assert len(files(ipam_dir, "ips")) == len(files(ipam_dir / "ipv6", "ips")) == 64


# --- hostile directories (issue 13): root's IPAM files live only in root's own directories -----------


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to hand a directory to another user")
@pytest.mark.parametrize("which", ["ipam-dir", "ips", "pods-symlink"])
def test_ipam_refuses_a_directory_another_user_controls(ipam_dir: Path, tmp_path: Path, which: str) -> None:
    from netplugin.core.errors import NetpluginError

    ipam_dir.mkdir(parents=True, mode=0o755)
    if which == "ipam-dir":
        os.chown(ipam_dir, 65534, 65534)  # nobody's: nobody could swap root's records
        victim = ipam_dir
    elif which == "ips":
        (ipam_dir / "ips").mkdir(mode=0o777)
        os.chmod(ipam_dir / "ips", 0o777)  # world-writable, whatever the umask was
        victim = ipam_dir / "ips"
    else:
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        (ipam_dir / "pods").symlink_to(elsewhere)  # root would write pod records wherever it points
        victim = ipam_dir / "pods"
    with pytest.raises(NetpluginError) as info:
        IPAM(str(ipam_dir), "10.204.7.0/24").allocate("abc123", "default", "web-0")
    assert str(victim) in info.value.message
    assert not list((tmp_path / "bridge" / "cbr0").glob("**/abc123"))  # nothing was recorded anywhere
    assert not (tmp_path / "elsewhere").exists() or not list((tmp_path / "elsewhere").iterdir())


def test_released_records_give_their_inodes_to_the_next_pods(ipam_dir: Path) -> None:
    # A pod's two records (pods/<infra>, ips/<addr>) are made from the spares of earlier pods
    # (netplugin.core.spares): no inode is allocated per pod once a few pods have come and gone.
    ipam = IPAM(str(ipam_dir), "10.204.8.0/24")
    seen: set[int] = set()
    for i in range(8):
        infra = f"spare{i}"
        ip, _ = ipam.allocate(infra, "ns", f"p{i}")
        made = {(ipam_dir / "pods" / infra).stat().st_ino, (ipam_dir / "ips" / ip).stat().st_ino}
        if i >= 1:
            assert made <= seen, f"pod {i}: its records got new inodes"
        assert (ipam_dir / "ips" / ip).read_text() == f"{infra}\n"
        assert (ipam_dir / "pods" / infra).read_text() == f"{ip}/24 ns p{i}\n"
        seen |= made
        assert ipam.release(infra) == ip
        seen |= {p.stat().st_ino for p in (ipam_dir / ".spare").iterdir()}
    assert len(seen) <= 2
    # A taken address is never overwritten, spare or not.
    (ipam_dir / "ips" / "10.204.8.2").write_text("someone\n")
    ip, _ = ipam.allocate("after", "ns", "p")
    assert ip != "10.204.8.2" and (ipam_dir / "ips" / "10.204.8.2").read_text() == "someone\n"


def test_init_makes_the_records_spares_ahead_of_the_pods(ipam_dir: Path) -> None:
    from netplugin.core.spares import CAP

    ipam = PodIPAM(str(ipam_dir), [ipaddress.ip_network("10.205.9.0/24"), ipaddress.ip_network("fd00:10:205:9::/64")])
    ipam.check()
    for fam in ipam.families:
        spares = Path(fam.directory) / ".spare"
        assert len(list(spares.iterdir())) == CAP
    allocs, _ = ipam.claim("stocked", "ns", "p")
    ip4 = Path(ipam.families[0].directory) / "ips" / allocs[0].ip
    assert len(list((Path(ipam.families[0].directory) / ".spare").iterdir())) == CAP - 2, "both records took spares"
    assert ip4.read_text() == "stocked\n"
