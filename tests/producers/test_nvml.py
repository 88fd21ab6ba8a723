"""NVML answers (pynvml's own ctypes structures) → GpuSample."""

from __future__ import annotations

import pynvml
import pytest

from argus.producers.collectors.nvml import (
    NVLINK_ERROR_FIELDS,
    NVLINK_RX_FIELD,
    NVLINK_TX_FIELD,
    NvmlReading,
    NvmlSampler,
    field_value,
    gpu_sample,
    run_node_agent,
)


def fv(field_id: int, value: int, *, ret: int = 0, vtype: int = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG):
    f = pynvml.c_nvmlFieldValue_t()
    f.fieldId, f.nvmlReturn, f.valueType = field_id, ret, vtype
    f.value.ullVal = value
    return f


def test_gpu_sample_from_nvml_structures():
    util = pynvml.c_nvmlUtilization_t()
    util.gpu, util.memory = 87, 40
    fields = [
        fv(NVLINK_TX_FIELD, 1000),
        fv(NVLINK_RX_FIELD, 2000),
        fv(NVLINK_ERROR_FIELDS[0], 3),
        fv(NVLINK_ERROR_FIELDS[2], 4),
        fv(NVLINK_ERROR_FIELDS[3], 99, ret=pynvml.NVML_ERROR_NOT_SUPPORTED),
    ]
    throttle = pynvml.nvmlClocksEventReasonHwSlowdown | pynvml.nvmlClocksEventReasonSwPowerCap
    r = NvmlReading(
        index=3,
        uuid="GPU-abc",
        utilization=util,
        sm_clock_mhz=1410,
        power_mw=312_500,
        temp_c=71,
        clock_event_reasons=throttle,
        ecc_dbe=2,
        remapped_rows=(5, 1, 0, 0),
        field_values=fields,
        xids=[79, 48],
    )
    s = gpu_sample("node7", 123, r)
    assert (s.host, s.gpu_uuid, s.gpu_index, s.time_ns) == ("node7", "GPU-abc", 3, 123)
    assert (s.gpu_util, s.sm_clock_mhz, s.power_w, s.temp_c) == (87.0, 1410.0, 312.5, 71.0)
    assert s.clock_event_reasons == throttle and s.xid == 48 and s.ecc_dbe == 2 and s.remapped_rows == 1
    assert (s.nvlink_tx_bytes, s.nvlink_rx_bytes, s.nvlink_errors) == (1000 * 1024, 2000 * 1024, 7)


def test_unsupported_answers_are_zero_and_field_types_are_read():
    s = gpu_sample("h", 1, NvmlReading(index=0, uuid="GPU-x"))
    assert (s.gpu_util, s.power_w, s.xid, s.nvlink_errors) == (0.0, 0.0, 0, 0)
    d = pynvml.c_nvmlFieldValue_t()
    d.valueType, d.nvmlReturn = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, 0
    d.value.uiVal = 7
    assert field_value(d) == 7
    assert field_value(fv(1, 5, ret=pynvml.NVML_ERROR_NOT_SUPPORTED)) is None


def test_node_agent_says_absent_once_without_a_gpu():
    sampler = NvmlSampler("h")
    ok, _ = sampler.open()
    if ok:
        pytest.skip("this machine has a GPU")
    reasons: list[str] = []
    assert run_node_agent(None, NvmlSampler("h"), max_rounds=3, on_absent=reasons.append) == 0
    assert len(reasons) == 1 and reasons[0]
