"""Test hosts: network namespaces on one bridge, each with an address of its own, so that tests
see what a cluster of machines sees (a worker on another host is reached over the network, its
address names that host, and a pulled link is silence rather than a reset).

The test's own process stays in the machine's namespace, on the bridge at `TestHosts.here`; a
program starts on a test host through `ip netns exec`. Everything made is deleted by `close()`,
also when a test fails. Traffic goes only to the addresses of the subnet made here.
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Sequence

import pytest


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def unavailable_reason(firewall: bool = False) -> str | None:
    """Why test hosts cannot be made here (with `firewall`: or cut from each other), or None."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return "test hosts need root and iproute2's ip (network namespaces)"
    if firewall and shutil.which("nft") is None:
        return "cutting two test hosts apart needs nftables' nft (apt-get install nftables; CI installs it)"
    return None


def require_test_hosts(firewall: bool = False) -> None:
    """Skips the test where test hosts cannot be made (with `firewall`: or cut from each other);
    fails it under CI=true, so CI cannot pass without running it."""
    reason = unavailable_reason(firewall)
    if reason is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(reason)
    pytest.skip(reason)


@dataclasses.dataclass(frozen=True)
class Host:
    name: str
    namespace: str
    address: str
    # This host's end of its veth pair, on the bridge in the machine's namespace: pulling it
    # partitions the host from everyone.
    bridge_port: str

    def launcher(self) -> list[str]:
        """The command prefix that runs a program on this host."""
        return ["ip", "netns", "exec", self.namespace]


def freeze(pid: int) -> None:
    """Stops a process (SIGSTOP) as a hung host would: its connections stay open and its
    kernel still answers them, but nothing it should send comes."""
    os.kill(pid, signal.SIGSTOP)


def thaw(pid: int) -> None:
    """Lets a frozen process run on (SIGCONT)."""
    os.kill(pid, signal.SIGCONT)


_LOCK_FILE = "/tmp/dataservice-test-hosts.lock"


def _free_subnet(tag: int) -> str:
    """A 10.214.<n> subnet no address of this machine is in (from n = tag % 250 on)."""
    listing = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, timeout=30).stdout
    taken = set(re.findall(r"inet 10\.214\.(\d+)\.", listing))
    for step in range(250):
        n = (tag + step) % 250
        if str(n) not in taken:
            return f"10.214.{n}"
    raise RuntimeError("every 10.214.<n>.0/24 test subnet is taken: remove leftover ds* links")


def _remove_leftovers() -> None:
    """Deletes the test hosts of test processes that died without tearing theirs down (SIGKILL):
    names carry their process's id."""
    listing = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, timeout=30).stdout
    links = {part.split("@")[0] for line in listing.splitlines() for part in line.split(": ")[1:2]}
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30).stdout.split()
    for name in sorted(links | set(namespaces)):
        match = re.fullmatch(r"ds(?:br|p|h)(\d+)(?:-\d+)?", name)
        if match is None or os.path.exists(f"/proc/{match.group(1)}"):
            continue
        if name in namespaces:
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
        else:
            subprocess.run(["ip", "link", "del", name], capture_output=True, timeout=30)


class TestHosts:
    """`names` hosts on a bridge of their own (subnet 10.214.<n>.0/24, <n> from this process's id,
    so that concurrent test processes do not meet); this process is at `here` (.1)."""

    __test__ = False  # not a test class

    def __init__(self, names: Sequence[str]):
        tag = os.getpid()
        self._bridge = f"dsbr{tag}"
        self.hosts: dict[str, Host] = {}
        # Per host, the hosts it is cut from (cut()).
        self._cut: dict[str, set[str]] = {}
        # Test processes side by side (pytest-xdist) each make hosts: the subnet is chosen, and
        # the bridge given its address, under a lock, so that no two take the same subnet.
        with open(_LOCK_FILE, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            _remove_leftovers()
            self._subnet = _free_subnet(tag)
            self.here = f"{self._subnet}.1"
            _ip("link", "add", self._bridge, "type", "bridge")
            try:
                _ip("addr", "add", f"{self.here}/24", "dev", self._bridge)
            except BaseException:
                _ip("link", "del", self._bridge)
                raise
        try:
            _ip("link", "set", self._bridge, "up")
            for number, name in enumerate(names, start=2):
                self._add(name, number, tag)
        except BaseException:
            self.close()
            raise

    def _add(self, name: str, number: int, tag: int) -> None:
        host = Host(name, f"dsh{tag}-{number}", f"{self._subnet}.{number}", f"dsp{tag}-{number}")
        inside = f"dsi{tag}-{number}"
        _ip("netns", "add", host.namespace)
        self.hosts[name] = host
        _ip("link", "add", host.bridge_port, "type", "veth", "peer", "name", inside)
        _ip("link", "set", inside, "netns", host.namespace)
        _ip("link", "set", host.bridge_port, "master", self._bridge)
        _ip("link", "set", host.bridge_port, "up")
        _ip("-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", inside)
        _ip("-n", host.namespace, "link", "set", inside, "up")
        _ip("-n", host.namespace, "link", "set", "lo", "up")

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    def partition(self, name: str) -> None:
        """Cuts `name` off from every other host and from this process: its packets go nowhere,
        and nothing tells its peers."""
        _ip("link", "set", self.hosts[name].bridge_port, "down")

    def heal(self, name: str) -> None:
        _ip("link", "set", self.hosts[name].bridge_port, "up")

    def cut(self, first: str, second: str) -> None:
        """Cuts two hosts apart, silently (a firewall in each drops the other's packets both
        ways); each still reaches every other host and this process."""
        self._cut.setdefault(first, set()).add(second)
        self._cut.setdefault(second, set()).add(first)
        self._apply_cuts(first)
        self._apply_cuts(second)

    def mend(self, first: str, second: str) -> None:
        """Undoes cut(first, second)."""
        self._cut.get(first, set()).discard(second)
        self._cut.get(second, set()).discard(first)
        self._apply_cuts(first)
        self._apply_cuts(second)

    def _apply_cuts(self, name: str) -> None:
        """Replaces the host's firewall table (nftables, in its namespace) with one dropping
        what goes to or comes from the hosts it is cut from."""
        peers = ", ".join(self.hosts[peer].address for peer in sorted(self._cut.get(name, ())))
        script = "add table inet dstest\ndelete table inet dstest\n"
        if peers:
            script += (
                "table inet dstest {\n"
                f"  chain out {{ type filter hook output priority 0; ip daddr {{ {peers} }} drop; }}\n"
                f"  chain in {{ type filter hook input priority 0; ip saddr {{ {peers} }} drop; }}\n"
                "}\n"
            )
        subprocess.run(
            ["ip", "netns", "exec", self.hosts[name].namespace, "nft", "-f", "-"],
            input=script,
            text=True,
            check=True,
            capture_output=True,
            timeout=30,
        )

    def close(self) -> None:
        # Each veth pair first, while its far end's namespace lives: deleted after the namespace,
        # it can wait for the kernel's (asynchronous) cleanup of that namespace.
        for host in self.hosts.values():
            subprocess.run(["ip", "link", "del", host.bridge_port], capture_output=True, timeout=30)
            subprocess.run(["ip", "netns", "del", host.namespace], capture_output=True, timeout=30)
        self.hosts.clear()
        subprocess.run(["ip", "link", "del", self._bridge], capture_output=True, timeout=30)
