import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def pytest_collection_modifyitems(config, items):
    # Two tiers (README, "Tests"): a test that starts processes is `procs`; those with a
    # hard time limit are exactly the ones that run real processes (the rule below), so
    # they are marked here, and _procs_marked fails any other that starts one.
    for item in items:
        if item.get_closest_marker("hard_timeout") is not None:
            item.add_marker(pytest.mark.procs)
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items:
        return
    import torch
    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs a CUDA device")
        for item in gpu_items:
            item.add_marker(skip)


@pytest.fixture
def admin(server):
    """An admin-token client of the module's `server` fixture (a ThreadServer)."""
    import httpx

    from api_support import admin_headers
    with httpx.Client(base_url=server.url, headers=admin_headers(), timeout=10) as c:
        yield c


# ---- hard time limits --------------------------------------------------------------------
# Tests that run real processes carry @pytest.mark.hard_timeout(SECONDS). At the limit the
# test's main thread gets an exception (so its `finally` blocks kill workers and servers);
# if even that is stuck in C code, the whole run exits 30 s later with every thread's stack.

class HardTimeout(BaseException):
    """BaseException: an `except Exception` in the code under test must not swallow it."""


def pytest_configure(config):
    config.addinivalue_line("markers", "hard_timeout(seconds): fail the test, and clean up, "
                                       "when it runs longer; exit the run if cleanup hangs")
    _watch_process_starts()


# ---- the fast tier stays fast ---------------------------------------------------------------
# `pytest -m "not procs and not slow"` is the day-to-day tier: no test in it may start a process. Every
# start in this pytest process is counted (subprocess and multiprocessing both end in one
# of these two calls); a test not marked `procs` that starts one fails, naming the mark.

_STARTS: list[str] = []


def _watch_process_starts() -> None:
    import multiprocessing.process
    import subprocess
    if getattr(subprocess.Popen, "_recycle_watched", False):
        return
    popen_init, mp_start = subprocess.Popen.__init__, multiprocessing.process.BaseProcess.start

    def init(self, args, *a, **kw):
        _STARTS.append(str(args)[:80])
        popen_init(self, args, *a, **kw)

    def start(self):
        _STARTS.append(f"multiprocessing {self.name}")
        mp_start(self)
    subprocess.Popen.__init__ = init
    subprocess.Popen._recycle_watched = True
    multiprocessing.process.BaseProcess.start = start


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    item._starts_before = len(_STARTS)  # before its fixtures too (a module's server)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if call.when != "teardown" or item.get_closest_marker("procs") is not None:
        return
    before = getattr(item, "_starts_before", len(_STARTS))
    if len(_STARTS) > before and rep.passed:
        rep.outcome = "failed"
        rep.longrepr = (f"started {_STARTS[before]} but is not marked procs (give it "
                        "@pytest.mark.hard_timeout(SECONDS), or pytestmark = "
                        "pytest.mark.procs for a module whose fixtures start processes)")


@pytest.fixture(autouse=True)
def _hard_timeout(request):
    import faulthandler
    import signal
    import threading
    mark = request.node.get_closest_marker("hard_timeout")
    if mark is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    seconds = float(mark.args[0])

    def expire(signum, frame):
        raise HardTimeout(f"{request.node.nodeid} ran past its {seconds:g} s limit")

    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    faulthandler.dump_traceback_later(seconds + 30, exit=True)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        faulthandler.cancel_dump_traceback_later()


# ---- no process left behind ---------------------------------------------------------------
# Every test that starts processes (those with a hard time limit) must leave none running:
# workers, servers, solver pools. multiprocessing's forkserver and resource tracker, which
# belong to the pytest process itself and end with it, are the only exceptions.

def _proc_table() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) of every live, non-zombie process."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{d}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if fields[0] != "Z":
            out[int(d)] = (int(fields[1]), cmd)
    return out


def _leftovers(root: int) -> dict[int, str]:
    table = _proc_table()
    kids: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        kids.setdefault(ppid, []).append(pid)
    out, todo = {}, [(k, True) for k in kids.get(root, [])]
    while todo:
        pid, direct = todo.pop()
        cmd = table[pid][1]
        if not (direct and ("multiprocessing.forkserver" in cmd
                            or "multiprocessing.resource_tracker" in cmd)):
            out[pid] = cmd
        todo.extend((k, False) for k in kids.get(pid, []))
    return out


@pytest.fixture(autouse=True)
def _no_process_left(request):
    if not sys.platform.startswith("linux") or request.node.get_closest_marker("hard_timeout") is None:
        yield
        return
    import signal
    import time
    before = set(_leftovers(os.getpid()))
    yield
    end = time.monotonic() + 10  # servers get SIGTERM and a few seconds to exit
    left = {}
    while time.monotonic() < end:
        left = {p: c for p, c in _leftovers(os.getpid()).items() if p not in before}
        if not left:
            return
        time.sleep(0.1)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    pytest.fail(f"left {len(left)} process(es) running: "
                + "; ".join(f"{p} {c[:80]}" for p, c in left.items()), pytrace=False)
