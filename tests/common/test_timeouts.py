"""How long the Python tests are willing to wait, scaled by one factor (README, "Tests").

DDP_TEST_TIMEOUT_SCALE (a positive number, default 1) multiplies every timeout in the
tests that only guards against a hang, and every bound a test compares a duration with to
check that something is "fast": a slow or loaded machine raises them all at once. Timeouts
that are the behaviour under test are not scaled. tests/common/test_timeouts.hpp is the
C++ twin; both read the variable the same way.
"""
import math
import os


def _read_scale():
    v = os.environ.get("DDP_TEST_TIMEOUT_SCALE", "")
    if v == "":
        return 1.0
    try:
        d = float(v)
    except ValueError:
        d = math.nan
    if not math.isfinite(d) or d <= 0:
        # A typo must not quietly run the suite at the default.
        raise SystemExit(f"DDP_TEST_TIMEOUT_SCALE='{v}': expected a positive number")
    return d


SCALE = _read_scale()


def scaled(seconds):
    """seconds times the factor."""
    return seconds * SCALE
