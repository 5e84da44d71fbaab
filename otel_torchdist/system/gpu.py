"""GPUs through NVML (``import pynvml``, package nvidia-ml-py), for each GPU this rank uses.

Which GPUs: the CUDA devices this process uses (see ``sampler.py``), matched to NVML by UUID, else by PCI
address. NVML numbers GPUs physically and ignores ``CUDA_VISIBLE_DEVICES``, so torch's ``cuda:0`` may be
NVML's GPU 3; the ``gpu`` label is NVML's number, as ``nvidia-smi`` and dcgm-exporter show it.

Units as exported: utilization 0..1 (NVML: percent), bytes, watts (NVML: milliwatts), degrees Celsius,
hertz (NVML: MHz), PCIe bytes/s (NVML: KB/s, taken as 1000 bytes), NVLink bytes (NVML: cumulative KiB, a
counter here from the sampler's first reading). Every query is guarded: one the GPU does not support, or
may not be asked (NVLink on a PCIe card, ECC on a consumer card), is dropped for that GPU after its first
refusal and its series is simply absent; any other NVML error is counted in ``torchdist.telemetry.errors``
(``kind="system"``). NVML calls release the GIL and touch no CUDA context.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .. import health
from .. import names as n
from ..telemetry import MetricData, NumberPoint
from .series import Deltas, labels

# Label values of torchdist.gpu.throttled, with the NVML bit each one reads (names as in NVML's
# nvmlClocksEventReason* constants, snake-cased). Bits are NVML's documented values.
THROTTLE_REASONS = (
    ("gpu_idle", 0x1),
    ("applications_clocks_setting", 0x2),
    ("sw_power_cap", 0x4),
    ("hw_slowdown", 0x8),
    ("sync_boost", 0x10),
    ("sw_thermal_slowdown", 0x20),
    ("hw_thermal_slowdown", 0x40),
    ("hw_power_brake_slowdown", 0x80),
    ("display_clock_setting", 0x100),
)
ECC_TYPES = ("corrected", "uncorrected")
PCIE_KB = 1000  # NVML reports PCIe throughput in "KB/s"
NVLINK_KIB = 1024  # NVLink throughput fields count KiB

# NVML answers that mean "not here", not "broken": the query is dropped for that GPU.
_REFUSALS = (3, 4, 13)  # NVML_ERROR_NOT_SUPPORTED, NO_PERMISSION, FUNCTION_NOT_FOUND


@dataclass(slots=True)
class GpuReading:
    """One sample of one GPU, in exported units. None: not available on this GPU."""

    gpu: int  # NVML index
    uuid: str
    model: str
    utilization: float | None = None
    memory_used: int | None = None
    memory_total: int | None = None
    power_w: float | None = None
    temperature_c: float | None = None
    sm_clock_hz: float | None = None
    pcie_tx: float | None = None  # bytes/s
    pcie_rx: float | None = None
    nvlink_tx_kib: int | None = None  # raw cumulative counts
    nvlink_rx_kib: int | None = None
    throttled: dict[str, int] = field(default_factory=dict)
    ecc: dict[str, int] = field(default_factory=dict)  # raw volatile counts


@dataclass(slots=True)
class GpuTarget:
    torch_index: int
    nvml_index: int
    handle: Any
    uuid: str
    model: str
    pci_bus_id: str
    memory_total: int | None
    throttle_supported: int | None = None


def _norm_uuid(uuid: str) -> str:
    return uuid.lower().removeprefix("gpu-")


def match_device(
    torch_uuid: str | None, torch_pci: tuple[int, int, int] | None, nvml: list[tuple[str, tuple[int, int, int]]]
) -> int | None:
    """The NVML index of a CUDA device given its UUID and PCI (domain, bus, device); ``nvml`` lists each
    NVML device's (uuid, pci) in NVML order. UUID first (torch prints it without NVML's ``GPU-`` prefix)."""
    if torch_uuid:
        want = _norm_uuid(torch_uuid)
        for i, (uuid, _) in enumerate(nvml):
            if _norm_uuid(uuid) == want:
                return i
    if torch_pci is not None:
        found = [i for i, (_, pci) in enumerate(nvml) if pci == torch_pci]
        if len(found) == 1:
            return found[0]
    return None


class NvmlSampler:
    def __init__(self, host: str) -> None:
        self.host = host
        self.nvml: Any = None
        self.driver_version: str | None = None
        self._devices: list[tuple[str, tuple[int, int, int]]] = []
        self._handles: list[Any] = []
        self.targets: dict[int, GpuTarget | None] = {}  # torch index -> target (None: no NVML match)
        self._refused: set[tuple[int, str]] = set()
        self._nvlink = Deltas()
        self._ecc = Deltas()

    # ------------------------------------------------------------------------------------- set-up
    def start(self) -> str | None:
        """Load and initialize NVML; on failure return why (no exception)."""
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
        self.nvml = pynvml
        try:
            self.driver_version = str(pynvml.nvmlSystemGetDriverVersion())
        except Exception:
            pass
        try:
            for i in range(pynvml.nvmlDeviceGetCount()):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                pci = pynvml.nvmlDeviceGetPciInfo(h)
                self._handles.append(h)
                self._devices.append((str(pynvml.nvmlDeviceGetUUID(h)), (int(pci.domain), int(pci.bus), int(pci.device))))
        except Exception as exc:
            self.shutdown()
            return f"cannot enumerate GPUs ({type(exc).__name__}: {exc})"
        return None

    def shutdown(self) -> None:
        if self.nvml is not None:
            try:
                self.nvml.nvmlShutdown()
            except Exception:
                pass
            self.nvml = None

    def target(self, torch_index: int, properties: Callable[[], Any]) -> GpuTarget | None:
        """The NVML device behind CUDA device ``torch_index``; ``properties()`` gives its torch device
        properties (asked once per device)."""
        if torch_index in self.targets:
            return self.targets[torch_index]
        props = properties()
        uuid = getattr(props, "uuid", None)
        pci = None
        if getattr(props, "pci_bus_id", None) is not None:
            pci = (int(getattr(props, "pci_domain_id", 0)), int(props.pci_bus_id), int(getattr(props, "pci_device_id", 0)))
        index = match_device(str(uuid) if uuid is not None else None, pci, self._devices)
        target = None
        if index is not None:
            nv = self.nvml
            h = self._handles[index]
            try:
                model = str(nv.nvmlDeviceGetName(h))
            except Exception:
                model = str(getattr(props, "name", "unknown"))
            try:
                bus_id = nv.nvmlDeviceGetPciInfo(h).busId
                bus_id = bus_id.decode() if isinstance(bus_id, bytes) else str(bus_id)
            except Exception:
                bus_id = ""
            target = GpuTarget(torch_index, index, h, self._devices[index][0], model, bus_id, None)
            mem = self._query(target, "memory", self._memory, h)
            target.memory_total = int(mem.total) if mem is not None else getattr(props, "total_memory", None)
            target.throttle_supported = self._query(target, "throttle_supported", self._supported_reasons, h)
        self.targets[torch_index] = target
        return target

    # -------------------------------------------------------------------------------------- reads
    def _query(self, t: GpuTarget, what: str, fn: Any, *args: Any) -> Any:
        key = (t.nvml_index, what)
        if key in self._refused:
            return None
        try:
            return fn(*args)
        except Exception as exc:
            if getattr(exc, "value", None) in _REFUSALS:
                self._refused.add(key)
            else:
                health.error("system", f"NVML could not read {what} of GPU {t.nvml_index}", exc)
            return None

    def _supported_reasons(self, h: Any) -> int:
        nv = self.nvml
        fn = getattr(nv, "nvmlDeviceGetSupportedClocksEventReasons", None) or nv.nvmlDeviceGetSupportedClocksThrottleReasons
        return int(fn(h))

    def _current_reasons(self, h: Any) -> int:
        nv = self.nvml
        fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or nv.nvmlDeviceGetCurrentClocksThrottleReasons
        return int(fn(h))

    def _memory(self, h: Any) -> Any:
        nv = self.nvml
        try:
            # v2 leaves driver-reserved memory out of "used", as current nvidia-smi does
            return nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2)
        except nv.NVMLError as exc:
            if getattr(exc, "value", None) not in _REFUSALS:
                raise
            return nv.nvmlDeviceGetMemoryInfo(h)

    def _nvlink_fields(self, h: Any) -> tuple[int | None, int | None]:
        nv = self.nvml
        values = nv.nvmlDeviceGetFieldValues(
            h, [nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX]
        )
        out = [int(v.value.ullVal) if v.nvmlReturn == nv.NVML_SUCCESS else None for v in values]
        if out == [None, None]:
            err = nv.NVMLError(values[0].nvmlReturn)  # report it like any other refusal or failure
            raise err
        return out[0], out[1]

    def read(self, t: GpuTarget) -> GpuReading:
        nv = self.nvml
        h = t.handle
        q = self._query
        r = GpuReading(t.nvml_index, t.uuid, t.model)
        util = q(t, "utilization", nv.nvmlDeviceGetUtilizationRates, h)
        if util is not None:
            r.utilization = util.gpu / 100.0
        mem = q(t, "memory", self._memory, h)
        if mem is not None:
            r.memory_used, r.memory_total = int(mem.used), int(mem.total)
        power = q(t, "power", nv.nvmlDeviceGetPowerUsage, h)
        if power is not None:
            r.power_w = power / 1000.0
        temp = q(t, "temperature", nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU)
        if temp is not None:
            r.temperature_c = float(temp)
        clock = q(t, "sm_clock", nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM)
        if clock is not None:
            r.sm_clock_hz = clock * 1e6
        tx = q(t, "pcie_tx", nv.nvmlDeviceGetPcieThroughput, h, nv.NVML_PCIE_UTIL_TX_BYTES)
        if tx is not None:
            r.pcie_tx = float(tx * PCIE_KB)
        rx = q(t, "pcie_rx", nv.nvmlDeviceGetPcieThroughput, h, nv.NVML_PCIE_UTIL_RX_BYTES)
        if rx is not None:
            r.pcie_rx = float(rx * PCIE_KB)
        nvlink = q(t, "nvlink", self._nvlink_fields, h)
        if nvlink is not None:
            r.nvlink_tx_kib, r.nvlink_rx_kib = nvlink
        if t.throttle_supported:
            current = q(t, "throttle", self._current_reasons, h)
            if current is not None:
                r.throttled = {
                    name: 1 if current & bit else 0 for name, bit in THROTTLE_REASONS if t.throttle_supported & bit
                }
        for kind, error_type in zip(ECC_TYPES, (nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)):
            count = q(t, f"ecc_{kind}", nv.nvmlDeviceGetTotalEccErrors, h, error_type, nv.NVML_VOLATILE_ECC)
            if count is not None:
                r.ecc[kind] = int(count)
        return r

    # ------------------------------------------------------------------------------------ metrics
    def metric_data(self, readings: list[GpuReading], base: dict[str, str]) -> list[MetricData]:
        gauges: dict[n.Metric, list[NumberPoint]] = {}
        out: list[MetricData] = []
        pcie, nvlink, throttled, ecc = [], [], [], []
        for r in readings:
            ident = (r.gpu, r.uuid, r.model, self.host)
            lab = labels(n.GPU_UTILIZATION, base, *ident)
            for metric, value in (
                (n.GPU_UTILIZATION, r.utilization),
                (n.GPU_MEMORY_USED, r.memory_used),
                (n.GPU_MEMORY_TOTAL, r.memory_total),
                (n.GPU_POWER, r.power_w),
                (n.GPU_TEMPERATURE, r.temperature_c),
                (n.GPU_SM_CLOCK, r.sm_clock_hz),
            ):
                if value is not None:
                    gauges.setdefault(metric, []).append(NumberPoint(lab, value))
            for direction, value in (("transmit", r.pcie_tx), ("receive", r.pcie_rx)):
                if value is not None:
                    pcie.append(NumberPoint(labels(n.GPU_PCIE_THROUGHPUT, base, *ident, direction), value))
            for direction, raw in (("transmit", r.nvlink_tx_kib), ("receive", r.nvlink_rx_kib)):
                if raw is not None:
                    total = int(self._nvlink.feed((r.uuid, direction), raw)) * NVLINK_KIB
                    nvlink.append(NumberPoint(labels(n.GPU_NVLINK_IO, base, *ident, direction), total))
            for reason, active in r.throttled.items():
                throttled.append(NumberPoint(labels(n.GPU_THROTTLED, base, *ident, reason), active))
            for kind, raw in r.ecc.items():
                ecc.append(NumberPoint(labels(n.GPU_ECC_ERRORS, base, *ident, kind), int(self._ecc.feed((r.uuid, kind), raw))))
        out += [MetricData(metric, points) for metric, points in gauges.items()]
        for metric, points in (
            (n.GPU_PCIE_THROUGHPUT, pcie),
            (n.GPU_NVLINK_IO, nvlink),
            (n.GPU_THROTTLED, throttled),
            (n.GPU_ECC_ERRORS, ecc),
        ):
            if points:
                out.append(MetricData(metric, points))
        return out

    def describe(self) -> list[dict[str, Any]]:
        return [
            {
                "torch_device": t.torch_index,
                "gpu": t.nvml_index,
                "uuid": t.uuid,
                "model": t.model,
                "pci_bus_id": t.pci_bus_id,
                "memory_bytes": t.memory_total,
            }
            for t in self.targets.values()
            if t is not None
        ]
