"""The name of the CPU this process runs on, part of every profile database key.

Kept apart from :mod:`objectives.profile` (which names every provider's hardware) so that
:mod:`objectives.torch_profile` can name the CPU without importing the profiler that imports it.
"""

from __future__ import annotations

import os
import platform

__all__ = ["cpu_device_name"]


def cpu_device_name() -> str:
    """The ``model name`` from ``/proc/cpuinfo`` (else :func:`platform.processor`) and the core count.

    Examples
    --------
    >>> cpu_device_name().endswith("cores)")
    True
    """
    model = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.lower().startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    model = model or platform.processor() or platform.machine() or "unknown cpu"
    return f"{model} ({os.cpu_count() or 1} cores)"
