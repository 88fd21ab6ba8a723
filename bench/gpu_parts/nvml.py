"""The ``nvml`` part: every field the node agent emits, sampled while a matmul loads the GPU,
with DCGM's name and unit for each."""

from __future__ import annotations

import socket
import threading
import time
from collections import defaultdict
from typing import Any

from .model import Size

# field -> (DCGM field, unit) for what the node agent emits (producers/collectors/nvml.py)
DCGM = {
    "utilization": ("DCGM_FI_DEV_GPU_UTIL", "%"),
    "sm_clock_mhz": ("DCGM_FI_DEV_SM_CLOCK", "MHz"),
    "power_mw": ("DCGM_FI_DEV_POWER_USAGE", "W"),
    "temp_c": ("DCGM_FI_DEV_GPU_TEMP", "C"),
    "clock_event_reasons": ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "bitmask"),
    "ecc_dbe": ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "count"),
    "remapped_rows": ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "count"),
    "xid_events": ("DCGM_FI_DEV_XID_ERRORS", "xid"),
    "field_138": ("DCGM_FI_PROF_NVLINK_TX_BYTES", "bytes (NVML: KiB)"),
    "field_139": ("DCGM_FI_PROF_NVLINK_RX_BYTES", "bytes (NVML: KiB)"),
    "field_38": ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "count"),
    "field_45": ("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "count"),
    "field_52": ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "count"),
    "field_59": ("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "count"),
}


def part_nvml(size: Size, device: str) -> dict[str, Any]:
    """Every field the node agent emits, sampled each second under a matmul load."""
    from argus.producers.collectors.nvml import FIELDS, NvmlSampler, field_value, read_device

    sampler = NvmlSampler(socket.gethostname())
    ok, reason = sampler.open()
    if not ok:
        return {"nvml": False, "reason": reason, "nvml_fields_ok": 0, "nvml_fields_refused": len(DCGM)}
    stop = threading.Event()
    load = threading.Thread(target=_matmul_load, args=(stop, device), daemon=True)
    load.start()
    seen: dict[str, list[float]] = defaultdict(list)
    refused: set[str] = set()
    samples = 0
    t_end = time.monotonic() + size.nvml_s
    try:
        while time.monotonic() < t_end:
            samples += len(sampler.sample())  # the node agent's own path, records as published
            nvml = sampler._nvml
            for i, h, uuid in sampler._devices:
                r = read_device(nvml, h, i, uuid)
                values = {
                    "utilization": None if r.utilization is None else r.utilization.gpu,
                    "sm_clock_mhz": r.sm_clock_mhz,
                    "power_mw": None if r.power_mw is None else r.power_mw / 1000,
                    "temp_c": r.temp_c,
                    "clock_event_reasons": r.clock_event_reasons,
                    "ecc_dbe": r.ecc_dbe,
                    "remapped_rows": None if r.remapped_rows is None else r.remapped_rows[1],
                }
                got = {int(fv.fieldId): field_value(fv) for fv in r.field_values}
                for f in FIELDS:
                    values[f"field_{f}"] = got.get(f)
                for k, v in values.items():
                    (seen[k].append(float(v)) if v is not None else refused.add(k))
            time.sleep(1.0)
    finally:
        stop.set()
        load.join(5)
        xid = "xid_events"
        if sampler._events is None:
            refused.add(xid)
        else:
            seen[xid].append(0.0)
        sampler.close()
    fields = {
        k: {
            "dcgm": DCGM[k][0],
            "unit": DCGM[k][1],
            "ok": k in seen and k not in refused,
            "min": min(seen[k]) if seen.get(k) else None,
            "max": max(seen[k]) if seen.get(k) else None,
        }
        for k in DCGM
    }
    return {
        "nvml": True,
        "reason": reason,
        "seconds": size.nvml_s,
        "records": samples,
        "nvml_fields_ok": sum(f["ok"] for f in fields.values()),
        "nvml_fields_refused": sorted(k for k, f in fields.items() if not f["ok"]),
        "fields": fields,
    }


def _matmul_load(stop: threading.Event, device: str) -> None:
    import torch

    if device != "cuda":
        return
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    while not stop.is_set():
        for _ in range(20):
            a = (a @ a).clamp_(-1, 1)
        torch.cuda.synchronize()
