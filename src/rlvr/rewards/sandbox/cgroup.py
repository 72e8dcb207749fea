"""One cgroup per running sample: memory (tmpfs and shm pages included), processes and CPU bounded
for the sample as a whole, not per process as rlimits are.

``CgroupHost.find()`` looks once per process for a place to make them:

- **cgroup v2**: the unified hierarchy with the memory, pids and cpu controllers. Samples go
  under the process's own cgroup when it already delegates those controllers to children;
  otherwise the process first moves itself into a leaf ``rlvr-trainer-<pid>`` (cgroup v2 lets a
  cgroup hand controllers to children only while it holds no process itself) and enables them.
  A child process of such a trainer (it starts in the leaf) uses the leaf's parent.
- **cgroup v1** (hybrid hosts, where memory, pids and cpu are v1 hierarchies): one child per
  controller under the process's own group in each (v1 has no rule against inner processes).

When neither works (not root and nothing delegated, another process shares the cgroup,
controllers missing) ``find`` returns None with the reason, and the sandbox warns loudly once.

A sample's group: ``memory.max`` (v1 ``memory.limit_in_bytes``, and ``memory.kmem.tcp`` for TCP
buffers, see ``TCP_SHARE``), no swap, ``memory.oom.group``
so an OOM kill takes the whole sample, ``pids.max`` and ``cpu.max`` (v1 CFS quota). Nothing of the
sample ever runs outside it:

- **cgroup v1**: the sample's first process is *born* inside (``spawning``): the thread that starts
  it moves itself into the group (``0`` written to each ``tasks`` file), starts it, and moves back
  before anything of the sample runs. Moving *another* process takes the kernel's global
  threadgroup lock, whose write side waits an RCU grace period (about 12 ms here, once per sample);
  a thread moving itself does not take it (0.3 ms of CPU for the three controllers). The main
  thread never does this (``inherits``), and the sandbox's launchers (the uid drop, the rlimits,
  bwrap itself) are inside too, so the sample's cgroup namespace is rooted at its own group.
- **cgroup v2** (a thread cannot sit in a different group than its process there): the first
  process is placed in it (``join``) while it waits at the sandbox's start gate, before it execs
  anything.

After the run the group is emptied (``cgroup.kill``, else SIGKILL of every member, then its CPU
quota lifted so the dying can free their memory at once), before the tree is waited for; its peak
memory and limit events are read, what it still has charged is reclaimed (``SampleCgroup.reclaim``,
whatever its size), and it is removed. A fresh group per sample, not a reused one: the page cache
a sample faults in stays charged to its group after it exits, so a reused group would start the
next sample with the last one's charges against its limit and peak; ``rmdir`` alone would hand
them to the parent, the trainer's group.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import select
import signal
import threading
import time
from dataclasses import dataclass, field

__all__ = ["CgroupHost", "SampleCgroup"]

CONTROLLERS = ("memory", "pids", "cpu")
TCP_SHARE = 4
"""cgroup v1 charges TCP (and UDP) buffers to a counter of their own (``memory.kmem.tcp``), not to
the memory limit, and only once it has a limit: a sample's is 1/TCP_SHARE of its memory limit
(without one, a 256 MB sample held 1.8 GB of unread loopback TCP). cgroup v2 charges them to
``memory.max``."""
WARM_AGAIN_ABOVE = 1 << 20
"""A sample's group found charged with more than this at its removal read files in (an ordinary
bwrap run leaves 0.36-0.96 MB of kernel memory, 121 samples, median 0.63): its reclaim may have
dropped start-up files the sandbox warmed, so the sandbox warms them again (``Sandbox._warm``)."""
_PERIOD_US = 100_000
_counter = itertools.count()


def _read(path: str) -> str:
    """A cgroup file's text, by raw ``os`` calls: a Python file object costs three more syscalls
    (and its set-up) per file, and a run reads and writes about twenty."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks).decode()
    finally:
        os.close(fd)


def _write(path: str, value: str) -> None:
    """One ``write`` of ``value`` (a cgroup file takes each write as one command)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)  # as open(path, "w")
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _keyed(path: str) -> dict[str, int]:
    """A flat-keyed cgroup file (``memory.events``, ``pids.events``) as a dict; {} when unreadable."""
    try:
        pairs = (line.split() for line in _read(path).splitlines())
        return {p[0]: int(p[1]) for p in pairs if len(p) == 2 and p[1].isdigit()}
    except OSError:
        return {}


def _await_exit(pids: list[int], timeout: float) -> None:
    """Block until one of ``pids`` (killed members) has exited, or ``timeout``. A killed sample's
    last process leaves its group only once its namespaces are torn down (a mount namespace's
    teardown waits for an RCU grace period, a millisecond or more): a pidfd wakes the caller the
    moment it is done, where a fixed poll overshoots. A sleep of 2 ms where pidfds are missing."""
    fds = []
    try:
        for pid in pids:
            try:
                fds.append(os.pidfd_open(pid))
            except ProcessLookupError:  # gone already: look again at once
                return
        poller = select.poll()
        for fd in fds:
            poller.register(fd, select.POLLIN)
        poller.poll(timeout * 1000)
    except (AttributeError, OSError):  # no pidfd_open here (Python < 3.9, Linux < 5.3)
        time.sleep(min(timeout, 0.002))
    finally:
        for fd in fds:
            os.close(fd)


def _mounts() -> list[tuple[str, str, set[str]]]:
    """(mount point, fs type, super options) of every cgroup mount."""
    out = []
    for line in _read("/proc/self/mountinfo").splitlines():
        left, _, right = line.partition(" - ")
        fields, rest = left.split(), right.split()
        if len(rest) >= 3 and rest[0] in ("cgroup", "cgroup2"):
            out.append((fields[4], rest[0], set(rest[2].split(","))))
    return out


def _own_paths() -> dict[str, str]:
    """Controller (``""`` for v2) -> this process's cgroup path, from /proc/self/cgroup."""
    out = {}
    for line in _read("/proc/self/cgroup").splitlines():
        _, names, path = line.split(":", 2)
        for name in names.split(",") if names else [""]:
            out[name] = path
    return out


@dataclass
class SampleCgroup:
    """One sample's group(s); ``procs`` are the files its first process writes its pid to;
    ``home`` (cgroup v1) the ``tasks`` files of this process's own groups, where a spawning
    thread goes back to."""

    dirs: list[str]
    version: int
    procs: list[str] = field(default_factory=list)
    home: list[str] = field(default_factory=list)
    limit: int | None = None  # the memory limit written at creation, in bytes
    _paths: dict[str, str] = field(default_factory=dict, repr=False)  # v1 file name -> the dir's path holding it
    _emptied: bool = field(default=False, repr=False)

    @property
    def inherits(self) -> bool:
        """Whether a process this thread starts inside ``spawning`` is born in the group (else
        ``join`` it). Never for the thread group leader: cgroup v1 charges the page faults of
        every thread of the trainer to its memory map's owner's group, so it must stay home."""
        return bool(self.home) and threading.get_native_id() != os.getpid()

    @contextlib.contextmanager
    def spawning(self):
        """Within it, the calling thread sits in the group (cgroup v1, ``inherits``), so the
        process it starts is born there; the thread is back home before the block ends, raising
        if it cannot be. A no-op otherwise."""
        if not self.inherits:
            yield
            return
        try:
            for d in self.dirs:
                _write(os.path.join(d, "tasks"), "0")  # 0: the writing thread itself
            yield
        finally:
            failed = []
            for tasks in self.home:
                try:
                    _write(tasks, "0")
                except OSError as err:
                    failed.append(f"{tasks}: {err}")
            if failed:
                raise RuntimeError(f"sandbox thread could not leave a sample cgroup ({'; '.join(failed)})")

    def _file(self, v2: str, v1: str) -> str:
        if self.version == 2:
            return os.path.join(self.dirs[0], v2)
        if v1 not in self._paths:  # looked up once: a group's interface files are made with it
            self._paths[v1] = next((os.path.join(d, v1) for d in self.dirs if os.path.exists(os.path.join(d, v1))),
                                   "/nonexistent")
        return self._paths[v1]

    def join(self, pid: int) -> None:
        """Move ``pid`` (and the children it makes from now on) into the group."""
        for procs in self.procs:
            _write(procs, str(pid))

    def members(self) -> list[int] | None:
        """The processes in any of the group's directories; None when one cannot be read."""
        pids: set[int] = set()
        for d in self.dirs:
            try:
                pids.update(int(p) for p in _read(os.path.join(d, "cgroup.procs")).split())
            except (OSError, ValueError):
                return None
        return sorted(pids)

    @property
    def found_empty(self) -> bool:
        """Whether ``kill`` has read every directory of the group and found no process in it
        (a group that has held a sample, once empty, stays so)."""
        return self._emptied

    def peak_bytes(self) -> int | None:
        try:
            return int(_read(self._file("memory.peak", "memory.max_usage_in_bytes")))
        except (OSError, ValueError):
            return None

    def limit_bytes(self) -> int | None:
        """The group's memory limit in bytes; None when unreadable or unlimited."""
        if self.limit is not None:
            return self.limit
        try:
            return int(_read(self._file("memory.max", "memory.limit_in_bytes")))
        except (OSError, ValueError):  # v2 writes "max" for no limit
            return None

    def events(self, peak: int | None = None) -> dict[str, int]:
        """``oom_kill`` (processes killed at the memory limit), ``memory_max`` (times the group's
        memory reached its limit and the kernel had to reclaim; at least 1 when its peak is the
        limit: some v1 kernels leave ``memory.failcnt`` at 0 even through an OOM kill, measured),
        ``pids_max`` (forks refused). ``peak``: the group's peak, when the caller has read it."""
        mem = _keyed(self._file("memory.events", "memory.oom_control"))
        if self.version == 2:
            at_limit = mem.get("max", 0)
        else:
            try:
                at_limit = int(_read(self._file("", "memory.failcnt")))
            except (OSError, ValueError):
                at_limit = 0
        peak, limit = peak if peak is not None else self.peak_bytes(), self.limit_bytes()
        if not at_limit and peak is not None and limit is not None and peak >= limit:
            at_limit = 1
        return {"oom_kill": mem.get("oom_kill", 0), "memory_max": at_limit,
                "pids_max": _keyed(self._file("pids.events", "pids.events")).get("max", 0)}

    def kill(self) -> list[int]:
        """SIGKILL every member at once (``cgroup.kill``, else one by one), never this process,
        then lift the group's CPU quota; the members found. Called before any wait on the tree.
        Once started and found empty, a group stays empty (only a member's fork or our own write
        puts a process in it): the later calls read nothing."""
        if self._emptied:
            return []
        members = self.members()
        pids = [p for p in members or () if p != os.getpid()]
        if not pids:
            self._emptied = members == []  # not while a thread of ours is stuck in it, nor unread
            return pids
        kill_file = os.path.join(self.dirs[0], "cgroup.kill") if self.version == 2 else None
        try:
            if not (kill_file and os.path.exists(kill_file)):
                raise OSError("no cgroup.kill")
            _write(kill_file, "1")
        except OSError:
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        self._lift_cpu_quota()  # after the signals: no member runs user code without its quota
        return pids

    def _lift_cpu_quota(self) -> None:
        """A killed member still needs CPU time to free its memory; under the group's own quota,
        spent by then, a 150 MB exit waited out periods of throttling (about a second)."""
        try:
            _write(self._file("cpu.max", "cpu.cfs_quota_us"), "max" if self.version == 2 else "-1")
        except OSError:
            pass

    def empty(self, wait_s: float = 3.0) -> int:
        """Kill every member until none is left (a spawning thread that could not leave is
        reported by ``spawning``); how many were found alive."""
        killed, deadline = 0, time.monotonic() + wait_s
        while (pids := self.kill()) and (left := deadline - time.monotonic()) > 0:
            killed = max(killed, len(pids))
            _await_exit(pids, min(left, 0.05))
        return killed

    def charged_bytes(self) -> int | None:
        """The group's whole memory charge (``memory.current``, v1 ``memory.usage_in_bytes``: the
        exact counter, kernel memory included); None when unreadable."""
        try:
            return int(_read(self._file("memory.current", "memory.usage_in_bytes")))
        except (OSError, ValueError):
            return None

    def reclaim(self) -> int | None:
        """Free what the (empty) group still has charged, whatever its size: removing it would hand
        the charge to the parent, the trainer's group, which would then grow with every sample
        graded (8 MB read per sample: 96 MB after 12; the dentries of 1,500 missing paths a sample,
        0.25 MB: 4.5 MB after 16), and the page cache a sample read in would stay cached for the
        next sample to find (an exact channel: ``/proc/self/pagemap``'s present bit, or whether a
        page's fault is minor, tells which pages are cached). One reclaim pass, not the kernel's
        retries on what it cannot free yet (an ordinary run leaves 0.25-0.3 MB of kernel memory
        that goes by itself later): v1 lowers the group's limit to 0 (the kernel makes one pass
        over its pages and shrinkable caches, then refuses: 0.13 ms a sample, where
        ``memory.force_empty`` retried for 0.6 ms of CPU, 3.5 ms at load 13); v2 asks
        ``memory.reclaim`` for what ``memory.stat`` counts reclaimable (file pages and
        reclaimable slab), so that it can stop once that is done. Best effort (a refusal leaves
        the charge to the parent). The charge found, None when unreadable (then reclaimed anyway)."""
        charged = self.charged_bytes()
        if charged == 0:
            return charged
        try:
            if self.version == 1:
                _write(self._file("", "memory.limit_in_bytes"), "0")
            else:
                stat = _keyed(self._file("memory.stat", ""))
                reclaimable = stat.get("file", 0) + stat.get("slab_reclaimable", 0) if stat else charged or 1 << 30
                if reclaimable:
                    _write(self._file("memory.reclaim", ""), str(reclaimable))
        except OSError:  # EBUSY (v1), EAGAIN (v2): not all of it could be freed
            pass
        return charged

    def remove(self) -> int | None:
        """Reclaim what the group holds if need be, then remove it; the charge ``reclaim`` found."""
        charged = self.reclaim()
        for d in self.dirs:
            for _ in range(200):  # rmdir is EBUSY for a moment after the last member exits
                try:
                    os.rmdir(d)
                    break
                except OSError as err:
                    if err.errno != errno.EBUSY:
                        break
                    time.sleep(0.005)
        return charged


class CgroupHost:
    """Where this process makes sample cgroups: ``parents`` maps controller -> directory."""

    def __init__(self, version: int, parents: dict[str, str]):
        self.version, self.parents = version, parents

    @classmethod
    def find(cls) -> tuple[CgroupHost | None, str]:
        """(a host, "") or (None, why per-sample cgroups are unavailable here)."""
        try:
            mounts, own = _mounts(), _own_paths()
        except (OSError, ValueError) as err:
            return None, f"cannot read the cgroup layout ({err})"
        v2 = next((m for m, kind, _ in mounts if kind == "cgroup2"), None)
        reasons = []
        if v2 is not None and "" in own:
            host, why = cls._v2(os.path.normpath(os.path.join(v2, own[""].lstrip("/"))))
            if host:
                return host, ""
            reasons.append(why)
        v1 = {c: m for m, kind, opts in mounts if kind == "cgroup" for c in CONTROLLERS if c in opts}
        if set(v1) == set(CONTROLLERS):
            parents = {c: os.path.normpath(os.path.join(v1[c], own.get(c, "/").lstrip("/"))) for c in v1}
            if all(os.access(p, os.W_OK) for p in parents.values()):
                return cls(1, parents), ""
            reasons.append(f"cgroup v1 groups {sorted(set(parents.values()))} are not writable")
        elif not reasons:
            reasons.append("no cgroup v2 or v1 hierarchy with the memory, pids and cpu controllers")
        return None, "; ".join(reasons)

    @classmethod
    def _v2(cls, own: str) -> tuple[CgroupHost | None, str]:
        need = set(CONTROLLERS)

        def delegated(d: str) -> bool:
            try:
                return need <= set(_read(os.path.join(d, "cgroup.subtree_control")).split()) and os.access(d, os.W_OK)
            except OSError:
                return False

        if delegated(own):
            return cls(2, {"": own}), ""
        parent = os.path.dirname(own)
        if os.path.basename(own).startswith("rlvr-trainer-") and delegated(parent):
            return cls(2, {"": parent}), ""
        try:
            available = set(_read(os.path.join(own, "cgroup.controllers")).split())
        except OSError as err:
            return None, f"cgroup v2 group {own} unreadable ({err})"
        if not need <= available:
            return None, f"cgroup v2 group {own} lacks controllers {sorted(need - available)}"
        leaf = os.path.join(own, f"rlvr-trainer-{os.getpid()}")
        try:
            os.makedirs(leaf, exist_ok=True)
            _write(os.path.join(leaf, "cgroup.procs"), str(os.getpid()))
        except OSError as err:
            return None, f"cannot make a leaf for this process in cgroup v2 group {own} ({err})"
        try:
            _write(os.path.join(own, "cgroup.subtree_control"), " ".join(f"+{c}" for c in CONTROLLERS))
        except OSError as err:  # other processes still live in `own`: put this one back
            try:
                _write(os.path.join(own, "cgroup.procs"), str(os.getpid()))
                os.rmdir(leaf)
            except OSError:
                pass
            return None, f"cannot delegate controllers in cgroup v2 group {own} ({err}; other processes share it)"
        return cls(2, {"": own}), ""

    def create(self, memory_bytes: int, pids: int, cpus: float) -> SampleCgroup:
        """A fresh, limited group for one sample (raises OSError when the kernel refuses)."""
        name = f"rlvr-sbx-{os.getpid()}-{next(_counter)}"
        quota = max(1000, int(cpus * _PERIOD_US))
        if self.version == 2:
            d = os.path.join(self.parents[""], name)
            os.mkdir(d)
            group = SampleCgroup([d], 2, [os.path.join(d, "cgroup.procs")], limit=memory_bytes)
            try:
                _write(os.path.join(d, "memory.max"), str(memory_bytes))
                for optional, value in (("memory.swap.max", "0"), ("memory.oom.group", "1")):
                    if os.path.exists(os.path.join(d, optional)):
                        _write(os.path.join(d, optional), value)
                _write(os.path.join(d, "pids.max"), str(pids))
                _write(os.path.join(d, "cpu.max"), f"{quota} {_PERIOD_US}")
            except OSError:
                group.remove()
                raise
            return group
        dirs = {c: os.path.join(p, name) for c, p in self.parents.items()}
        group = SampleCgroup(list(dict.fromkeys(dirs.values())), 1, limit=memory_bytes)
        try:
            for d in group.dirs:
                os.mkdir(d)
            _write(os.path.join(dirs["memory"], "memory.limit_in_bytes"), str(memory_bytes))
            for optional, value in (("memory.memsw.limit_in_bytes", memory_bytes),
                                    ("memory.kmem.tcp.limit_in_bytes", memory_bytes // TCP_SHARE)):
                if os.path.exists(os.path.join(dirs["memory"], optional)):
                    _write(os.path.join(dirs["memory"], optional), str(value))
            _write(os.path.join(dirs["pids"], "pids.max"), str(pids))
            _write(os.path.join(dirs["cpu"], "cpu.cfs_quota_us"), str(quota))  # of the kernel's 100 ms period
        except OSError:
            group.remove()
            raise
        group.procs = [os.path.join(d, "cgroup.procs") for d in group.dirs]
        group.home = [os.path.join(p, "tasks") for p in dict.fromkeys(self.parents.values())]
        return group
