"""Resources: what a task or actor asks for, what it holds, and the local runner's ledger.

* :class:`ResourceRequest`: CPUs, GPUs and memory (bytes) one task or actor needs. A GPU
  request above 1 must be a whole number (``ValueError`` otherwise); a request below 1 is
  a share of one device, and several such requests may share it.
* :class:`AcquiredResources`: what a request was granted: the CPUs, the memory and the
  exact GPU device ids. The holder sees exactly these devices through
  ``CUDA_VISIBLE_DEVICES`` (:meth:`AcquiredResources.env`).
* :class:`ResourceLedger`: the local runner's accounting of CPUs, memory and each GPU
  device. GPUs are counted per device in units of 1/10,000 of a device (as Ray does), so
  fractional shares add up exactly.
* :func:`discover_gpus`: the NVIDIA devices of this machine, through NVML (the ``pynvml``
  module of nvidia-ml-py); no driver means zero devices, not an error.

Ray does its own accounting: an actor asking for ``num_gpus`` gets devices from Ray, which
sets ``CUDA_VISIBLE_DEVICES`` for it.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
from dataclasses import dataclass, field
from typing import Any

#: Units of one GPU device in the ledger (a request of 0.25 GPU holds 2,500 units).
GPU_UNITS = 10_000


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class ResourceRequest:
    """What one task or actor needs while it lives.

    ``cpus`` and ``gpus`` are counts (fractions allowed: ``gpus=0.5`` shares a device with
    another half-GPU holder); ``memory_bytes`` is memory in bytes (None: not accounted).
    Raises ``ValueError`` for a negative value, or a GPU request above 1 that is not a whole
    number (``gpus=1.5``): devices are held whole or shared, never one and a half.
    """

    cpus: float = 1.0
    gpus: float = 0.0
    memory_bytes: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "cpus", _number("num_cpus", self.cpus))
        gpus = _number("num_gpus", self.gpus)
        if gpus > 1 and not gpus.is_integer():
            raise ValueError(
                f"num_gpus={self.gpus!r}: a GPU request above 1 must be a whole number of "
                "devices (fractions below 1 share one device)"
            )
        object.__setattr__(self, "gpus", gpus)
        mem = self.memory_bytes
        if mem is not None and (isinstance(mem, bool) or not isinstance(mem, int) or mem < 0):
            raise ValueError(f"memory_bytes must be an integer number of bytes >= 0, got {mem!r}")

    @property
    def gpu_units(self) -> int:
        """GPU units per device held (:data:`GPU_UNITS` for one or more whole devices)."""
        if self.gpus >= 1:
            return GPU_UNITS
        return round(self.gpus * GPU_UNITS)

    @property
    def whole_gpus(self) -> int:
        """Devices held whole (0 for a fractional or no GPU request)."""
        return int(self.gpus) if self.gpus >= 1 else 0

    def ray_options(self) -> dict[str, Any]:
        """The request as Ray ``.options()`` keywords (``num_cpus``, ``num_gpus``,
        ``memory`` in bytes when set)."""
        out: dict[str, Any] = {"num_cpus": self.cpus, "num_gpus": self.gpus}
        if self.memory_bytes:
            out["memory"] = self.memory_bytes
        return out

    def describe(self) -> str:
        """Short text, e.g. ``1 CPU, 0.5 GPU, 2.0 GiB``."""
        parts = [f"{self.cpus:g} CPU"]
        if self.gpus:
            parts.append(f"{self.gpus:g} GPU")
        if self.memory_bytes:
            parts.append(f"{self.memory_bytes / 2**30:.1f} GiB")
        return ", ".join(parts)


@dataclass(frozen=True)
class AcquiredResources:
    """What a :class:`ResourceRequest` was granted: ``cpus``, ``memory_bytes`` and the GPU
    device ids ``gpu_ids`` (empty without GPUs). ``gpu_units`` is the share of each device
    held, in 1/:data:`GPU_UNITS` of a device."""

    cpus: float
    memory_bytes: int
    gpu_ids: tuple[int, ...] = ()
    gpu_units: int = 0

    @property
    def cuda_visible_devices(self) -> str:
        """The ``CUDA_VISIBLE_DEVICES`` value of the holder: its device ids, comma-separated
        (empty: no device is visible)."""
        return ",".join(str(i) for i in self.gpu_ids)

    def env(self) -> dict[str, str]:
        """Environment variables of a process that holds these resources."""
        return {"CUDA_VISIBLE_DEVICES": self.cuda_visible_devices}


@dataclass
class ResourceLedger:
    """The local runner's accounting of CPUs, memory (bytes) and each GPU device.

    Thread-safe. :meth:`try_acquire` grants a request or returns None; :meth:`release`
    gives it back. GPU placement: a whole-device request takes the lowest-numbered free
    devices; a fractional one goes to the fullest device it still fits on (packing
    fractional holders together keeps whole devices free).
    """

    cpus: float
    memory_bytes: int
    gpus: tuple[int, ...] = ()
    _cpus_used: float = field(default=0.0, init=False)
    _memory_used: int = field(default=0, init=False)
    _gpu_used: dict[int, int] = field(default_factory=dict, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        self._gpu_used = {g: 0 for g in self.gpus}

    def fits_at_all(self, request: ResourceRequest, count: int = 1) -> bool:
        """Whether ``count`` holders of ``request`` fit in an empty ledger."""
        if request.cpus * count > self.cpus + 1e-9:
            return False
        if request.memory_bytes and request.memory_bytes * count > self.memory_bytes:
            return False
        if request.gpus >= 1:
            return request.whole_gpus * count <= len(self.gpus)
        if request.gpus > 0:
            per_device = GPU_UNITS // request.gpu_units
            return per_device * len(self.gpus) >= count
        return True

    def try_acquire(self, request: ResourceRequest) -> AcquiredResources | None:
        """Grant ``request`` now, or return None when it does not fit at the moment."""
        with self._lock:
            if self._cpus_used + request.cpus > self.cpus + 1e-9:
                return None
            mem = request.memory_bytes or 0
            if self._memory_used + mem > self.memory_bytes:
                return None
            ids = self._place_gpus(request)
            if ids is None:
                return None
            units = request.gpu_units if ids else 0
            for g in ids:
                self._gpu_used[g] += units
            self._cpus_used += request.cpus
            self._memory_used += mem
            return AcquiredResources(request.cpus, mem, ids, units)

    def _place_gpus(self, request: ResourceRequest) -> tuple[int, ...] | None:
        if request.gpus == 0:
            return ()
        if request.gpus >= 1:
            free = [g for g in self.gpus if self._gpu_used[g] == 0]
            if len(free) < request.whole_gpus:
                return None
            return tuple(free[: request.whole_gpus])
        need = request.gpu_units
        fitting = [g for g in self.gpus if self._gpu_used[g] + need <= GPU_UNITS]
        if not fitting:
            return None
        best = max(fitting, key=lambda g: (self._gpu_used[g], -g))
        return (best,)

    def release(self, held: AcquiredResources) -> None:
        """Give back what :meth:`try_acquire` granted."""
        with self._lock:
            self._cpus_used = max(0.0, self._cpus_used - held.cpus)
            self._memory_used = max(0, self._memory_used - held.memory_bytes)
            for g in held.gpu_ids:
                self._gpu_used[g] = max(0, self._gpu_used[g] - held.gpu_units)

    def available(self) -> dict[str, Any]:
        """Free CPUs, memory (bytes) and GPU share per device id (1.0: a free device)."""
        with self._lock:
            return {
                "cpus": self.cpus - self._cpus_used,
                "memory_bytes": self.memory_bytes - self._memory_used,
                "gpus": {g: (GPU_UNITS - u) / GPU_UNITS for g, u in self._gpu_used.items()},
            }

    def describe(self) -> str:
        """Totals as text, e.g. ``4 CPUs, GPUs [0, 1], 23.4 GiB``."""
        gpus = f"GPUs {list(self.gpus)}" if self.gpus else "no GPUs"
        return f"{self.cpus:g} CPUs, {gpus}, {self.memory_bytes / 2**30:.1f} GiB"


# ------------------------------------------------------------------ discovery


def parse_gpu_ids(text: str, what: str = "gpus") -> tuple[int, ...]:
    """Device ids from ``"0,1,2,3"`` (whitespace ignored; empty: none). Raises
    ``ValueError`` naming ``what`` for anything but distinct integers >= 0."""
    items = [s.strip() for s in text.split(",") if s.strip()]
    try:
        ids = tuple(int(s) for s in items)
    except ValueError:
        raise ValueError(
            f"{what}={text!r}: expected comma-separated GPU device ids such as '0,1,2,3'"
        ) from None
    if any(i < 0 for i in ids) or len(set(ids)) != len(ids):
        raise ValueError(f"{what}={text!r}: device ids must be distinct integers >= 0")
    return ids


def discover_gpus() -> tuple[int, ...]:
    """The ids of the NVIDIA GPUs this process may use, found with NVML.

    Zero devices where NVML or its driver library is missing. When the process itself runs
    with ``CUDA_VISIBLE_DEVICES`` set to integer ids, only those (that exist) are returned.
    """
    try:
        import pynvml
    except ImportError:  # pragma: no cover - the gpu extra (nvidia-ml-py) is not installed
        return ()
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return ()
    try:
        count = int(pynvml.nvmlDeviceGetCount())
    except pynvml.NVMLError:  # pragma: no cover - driver trouble after init
        count = 0
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()
    ids = tuple(range(count))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        try:
            allowed = parse_gpu_ids(visible, "CUDA_VISIBLE_DEVICES")
        except ValueError:  # UUIDs or MIG names: leave the NVML view as it is
            return ids
        ids = tuple(i for i in allowed if i < count)
    return ids


def gpu_info() -> list[dict[str, Any]]:
    """Name and total memory (bytes) of each NVIDIA device NVML sees (empty without)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return []
    try:
        out = []
        for i in range(int(pynvml.nvmlDeviceGetCount())):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            out.append(
                {
                    "index": i,
                    "name": name if isinstance(name, str) else name.decode(),
                    "memory_bytes": int(mem.total),
                }
            )
        return out
    finally:
        pynvml.nvmlShutdown()


def physical_memory_bytes() -> int:
    """Total physical memory of this machine, in bytes."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return 8 * 2**30


def local_ledger(cpus: int | None, gpus: str | None) -> ResourceLedger:
    """The ledger of the local runner: ``cpus`` (None: every core), GPUs from ``gpus``
    (the ``gpus`` setting, e.g. ``"0,1,2,3"``; None: :func:`discover_gpus`), and the
    machine's physical memory."""
    ids = parse_gpu_ids(gpus) if gpus is not None else discover_gpus()
    return ResourceLedger(float(cpus or os.cpu_count() or 1), physical_memory_bytes(), ids)
