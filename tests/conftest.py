import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items:
        return
    import torch
    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs a CUDA device")
        for item in gpu_items:
            item.add_marker(skip)


# ---- hard time limits --------------------------------------------------------------------
# Tests that run real processes carry @pytest.mark.hard_timeout(SECONDS). At the limit the
# test's main thread gets an exception (so its `finally` blocks kill workers and servers);
# if even that is stuck in C code, the whole run exits 30 s later with every thread's stack.

class HardTimeout(BaseException):
    """BaseException: an `except Exception` in the code under test must not swallow it."""


def pytest_configure(config):
    config.addinivalue_line("markers", "hard_timeout(seconds): fail the test, and clean up, "
                                       "when it runs longer; exit the run if cleanup hangs")


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
