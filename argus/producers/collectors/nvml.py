"""GPU health from NVML (nvidia-ml-py), one ``GpuSample`` per GPU per interval.

Fields are named after DCGM's: utilization (``DCGM_FI_DEV_GPU_UTIL``), SM clock, power,
temperature, clock-event (throttle) reasons, XID errors, double-bit ECC errors, remapped
rows, NVLink throughput and errors (field values 138/139 and the CRC/replay/recovery
totals). The pure part (:func:`gpu_sample`) turns NVML's answers (its ctypes structures
as pynvml returns them) into a record; :func:`read_device` asks NVML; :class:`NvmlSampler`
and :func:`run_node_agent` drive it. Without NVML or a GPU, :meth:`NvmlSampler.open`
returns the reason and the node agent reports it once and steps aside.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from argus.schemas import GPU_SAMPLES, GpuSample

from .gpu_probe import nvml_probe

__all__ = [
    "NVLINK_ERROR_FIELDS",
    "NVLINK_RX_FIELD",
    "NVLINK_TX_FIELD",
    "NvmlReading",
    "NvmlSampler",
    "field_value",
    "gpu_sample",
    "read_device",
    "run_node_agent",
]

log = logging.getLogger("argus.nvml")

NVLINK_TX_FIELD = 138  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX (KiB, cumulative)
NVLINK_RX_FIELD = 139  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX
NVLINK_ERROR_FIELDS = (38, 45, 52, 59)  # CRC flit, CRC data, replay, recovery error totals
FIELDS = (NVLINK_TX_FIELD, NVLINK_RX_FIELD, *NVLINK_ERROR_FIELDS)
_VALUE_MEMBER = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


@dataclass
class NvmlReading:
    """NVML's answers for one GPU (None where the GPU does not support the query)."""

    index: int
    uuid: str
    utilization: Any = None  # nvmlUtilization_t (.gpu, .memory in %)
    sm_clock_mhz: int | None = None
    power_mw: int | None = None
    temp_c: int | None = None
    clock_event_reasons: int | None = None
    ecc_dbe: int | None = None
    remapped_rows: Sequence[int] | None = None  # (correctable, uncorrectable, pending, failure)
    field_values: Sequence[Any] = field(default_factory=list)  # nvmlFieldValue_t
    xids: Sequence[int] = field(default_factory=list)  # XID events since the last reading


def field_value(fv: Any) -> int | None:
    """The value of one ``nvmlFieldValue_t`` (None when NVML returned an error for it)."""
    if int(fv.nvmlReturn) != 0:
        return None
    member = _VALUE_MEMBER.get(int(fv.valueType))
    return None if member is None else int(getattr(fv.value, member))


def gpu_sample(host: str, time_ns: int, r: NvmlReading) -> GpuSample:
    """The record of one reading (unsupported values are 0; the last XID of the interval)."""
    fields: dict[int, int] = {}
    for fv in r.field_values:
        v = field_value(fv)
        if v is not None:
            fields[int(fv.fieldId)] = v
    rows = r.remapped_rows
    return GpuSample(
        host=host,
        gpu_uuid=r.uuid,
        gpu_index=r.index,
        time_ns=time_ns,
        gpu_util=float(r.utilization.gpu) if r.utilization is not None else 0.0,
        sm_clock_mhz=float(r.sm_clock_mhz or 0),
        power_w=(r.power_mw or 0) / 1000.0,
        temp_c=float(r.temp_c or 0),
        clock_event_reasons=int(r.clock_event_reasons or 0),
        xid=int(r.xids[-1]) if r.xids else 0,
        ecc_dbe=int(r.ecc_dbe or 0),
        remapped_rows=int(rows[1]) if rows else 0,
        nvlink_tx_bytes=fields.get(NVLINK_TX_FIELD, 0) * 1024,
        nvlink_rx_bytes=fields.get(NVLINK_RX_FIELD, 0) * 1024,
        nvlink_errors=sum(fields.get(f, 0) for f in NVLINK_ERROR_FIELDS),
    )


def read_device(nvml: Any, handle: Any, index: int, uuid: str) -> NvmlReading:
    """Ask NVML (the pynvml module) about one GPU; unsupported queries stay None."""

    def ask(fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(handle, *args)
        except nvml.NVMLError:
            return None

    return NvmlReading(
        index=index,
        uuid=uuid,
        utilization=ask(nvml.nvmlDeviceGetUtilizationRates),
        sm_clock_mhz=ask(nvml.nvmlDeviceGetClockInfo, nvml.NVML_CLOCK_SM),
        power_mw=ask(nvml.nvmlDeviceGetPowerUsage),
        temp_c=ask(nvml.nvmlDeviceGetTemperature, nvml.NVML_TEMPERATURE_GPU),
        clock_event_reasons=ask(nvml.nvmlDeviceGetCurrentClocksEventReasons),
        ecc_dbe=ask(
            nvml.nvmlDeviceGetTotalEccErrors, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
        ),
        remapped_rows=ask(nvml.nvmlDeviceGetRemappedRows),
        field_values=ask(nvml.nvmlDeviceGetFieldValues, list(FIELDS)) or [],
    )


class NvmlSampler:
    """Every GPU of the node, read on demand, with XID events collected between readings."""

    def __init__(self, host: str) -> None:
        self.host = host
        self._nvml: Any = None
        self._devices: list[tuple[int, Any, str]] = []
        self._events: Any = None

    def open(self) -> tuple[bool, str]:
        """Initialize NVML; (False, reason) when there is nothing to sample here."""
        ok, reason = nvml_probe()
        if not ok:
            return False, reason
        import pynvml

        pynvml.nvmlInit()
        self._nvml = pynvml
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            uuid = pynvml.nvmlDeviceGetUUID(h)
            self._devices.append((i, h, uuid if isinstance(uuid, str) else uuid.decode()))
        try:
            self._events = pynvml.nvmlEventSetCreate()
            for _, h, _u in self._devices:
                pynvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, self._events)
        except pynvml.NVMLError as exc:
            log.info("XID events unavailable: %s", exc)
            self._events = None
        return True, reason

    def _xids(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        if self._events is None:
            return out
        nvml = self._nvml
        while True:
            try:
                data = nvml.nvmlEventSetWait_v2(self._events, 0)
            except nvml.NVMLError:  # timeout: no more events
                return out
            try:
                uuid = nvml.nvmlDeviceGetUUID(data.device)
            except nvml.NVMLError:
                uuid = ""
            out.setdefault(uuid if isinstance(uuid, str) else uuid.decode(), []).append(int(data.eventData))

    def sample(self) -> list[GpuSample]:
        """One record per GPU now."""
        now = time.time_ns()
        xids = self._xids()
        out = []
        for i, h, uuid in self._devices:
            reading = read_device(self._nvml, h, i, uuid)
            reading.xids = xids.get(uuid, [])
            out.append(gpu_sample(self.host, now, reading))
        return out

    def close(self) -> None:
        """Shut NVML down."""
        if self._nvml is not None:
            try:
                if self._events is not None:
                    self._nvml.nvmlEventSetFree(self._events)
                self._nvml.nvmlShutdown()
            except Exception:
                pass
            self._nvml = None


def run_node_agent(
    sink: Any,
    sampler: NvmlSampler,
    *,
    interval_s: float = 1.0,
    stop: threading.Event | None = None,
    max_rounds: int | None = None,
    on_absent: Callable[[str], None] | None = None,
) -> int:
    """Sample every ``interval_s`` and publish (key: host) until ``stop``; return rounds done.

    Without NVML or a GPU, ``on_absent(reason)`` is called once and 0 is returned.
    """
    ok, reason = sampler.open()
    if not ok:
        if on_absent is not None:
            on_absent(reason)
        return 0
    stop = stop or threading.Event()
    rounds = 0
    key = sampler.host.encode()
    try:
        while not stop.is_set() and (max_rounds is None or rounds < max_rounds):
            begin = time.monotonic()
            for rec in sampler.sample():
                sink.publish(GPU_SAMPLES, key, rec)
            rounds += 1
            stop.wait(max(0.0, interval_s - (time.monotonic() - begin)))
    finally:
        sampler.close()
    return rounds
