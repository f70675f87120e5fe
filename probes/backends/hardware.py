"""Which hardware a measurement ran on: the identity that goldens are stored and looked up by.

Two correct kernels of two machines round differently (another GEMM blocking, another vector
width, AMX tiles or not), so a figure in ulps only compares runs of one machine. The identity is
what decides which kernels run, and nothing else:

* **CPU**: the vendor, ATen's dispatch capability (``torch.backends.cpu.get_cpu_capability()``:
  DEFAULT, AVX2, AVX512, SVE...), the BLAS PyTorch was built with (MKL picks a different code path
  on another vendor's CPU), the instruction-set extensions that change reduced-precision kernels
  (AMX, AVX512-BF16 / FP16), and the environment variables that force another path
  (MKL_CBWR, MKL_ENABLE_INSTRUCTIONS, ONEDNN_MAX_CPU_ISA, ...). The model name is recorded, not
  keyed: virtual machines hide it, and two models with the same extensions run the same kernels.
* **CUDA**: the device name and compute capability.
* **NPU**: the SoC name (``torch_npu.npu.get_device_name()``).

Software versions (PyTorch, CUDA, CANN, torch_npu) are *not* part of the identity: the question a
golden answers is whether an upgrade changed an operator on the same hardware. They are recorded
beside it (``software()``), in the golden's ``made_with``.

torch and torch_npu are imported only when an identity is asked for.
"""

from __future__ import annotations

import functools
import os
import platform
import re
from dataclasses import dataclass, field
from typing import Any

# environment variables that send PyTorch's CPU kernels down another code path
PATH_VARIABLES = ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS", "MKL_DEBUG_CPU_TYPE",
                  "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")
# /proc/cpuinfo flags that change reduced-precision kernels (oneDNN's bf16/fp16 paths), short names
KERNEL_FLAGS = {"amx_bf16": "amx", "amx_fp16": "amxfp16", "avx512_bf16": "avx512bf16", "avx512_fp16": "avx512fp16"}
VENDORS = {"GenuineIntel": "intel", "AuthenticAMD": "amd", "HygonGenuine": "hygon", "CentaurHauls": "centaur"}
ARM_IMPLEMENTERS = {"0x41": "arm", "0x48": "hisilicon", "0x51": "qualcomm", "0x61": "apple", "0xc0": "ampere",
                    "0x46": "fujitsu", "0x4e": "nvidia"}


@dataclass(frozen=True)
class HardwareIdentity:
    """One machine kind: `key` names its goldens' folder, `details` are recorded in meta.json."""

    device: str  # "cpu", "cuda" or "npu"
    key: str  # letters, digits, '.', '_' and '-' only: a folder name
    description: str  # one line for people
    details: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "key": self.key, "description": self.description, **self.details}


def slug(text: str) -> str:
    """Lower-case letters, digits, '.' and '_', other runs as one '-'."""
    return re.sub(r"[^a-z0-9._]+", "-", text.lower()).strip("-") or "unknown"


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo ({} where there is none)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if not line.strip():
                    if fields:
                        break
                    continue
                name, _, value = line.partition(":")
                fields.setdefault(name.strip(), value.strip())
    except OSError:
        pass
    return fields


def cpu_identity(cpuinfo: dict[str, str] | None = None, environ: dict[str, str] | None = None) -> HardwareIdentity:
    info = _cpuinfo() if cpuinfo is None else cpuinfo
    environ = dict(os.environ) if environ is None else environ
    vendor_id = info.get("vendor_id", "")
    implementer = info.get("CPU implementer", "")
    vendor = VENDORS.get(vendor_id) or ARM_IMPLEMENTERS.get(implementer.lower()) or slug(
        vendor_id or implementer or platform.machine() or "unknown")
    model = info.get("model name") or info.get("Model") or platform.processor() or platform.machine()
    flags = set(info.get("flags", info.get("Features", "")).split())
    features = sorted(short for flag, short in KERNEL_FLAGS.items() if flag in flags)
    capability, blas = _torch_cpu_path()
    forced = {name: environ[name] for name in PATH_VARIABLES if environ.get(name)}
    parts = [vendor, capability, blas, *features]
    parts += [f"{slug(name).replace('_', '')}.{slug(value)}" for name, value in sorted(forced.items())
              if name != "ATEN_CPU_CAPABILITY"]  # the capability already shows it
    details = {"vendor": vendor_id or implementer or vendor, "model": model, "arch": platform.machine(),
               "capability": capability, "blas": blas, "features": ",".join(features)}
    details.update({f"env {k}": v for k, v in forced.items()})
    description = f"{model} ({vendor}, {capability}, {blas}{', ' + ', '.join(features) if features else ''})"
    return HardwareIdentity("cpu", slug("-".join(parts)), description, details)


def _torch_cpu_path() -> tuple[str, str]:
    """(ATen's CPU capability, the BLAS PyTorch was built with), 'unknown' without torch."""
    try:
        import torch
    except ImportError:
        return "unknown", "unknown"
    capability = "unknown"
    try:
        capability = str(torch.backends.cpu.get_cpu_capability())
    except Exception:  # an old torch without the query
        pass
    match = re.search(r"BLAS_INFO=([A-Za-z0-9_]+)", _torch_config())
    return slug(capability), slug(match.group(1) if match else "unknown")


@functools.lru_cache(maxsize=1)
def _torch_config() -> str:
    import torch

    try:
        return str(torch.__config__.show())
    except Exception:
        return ""


def cuda_identity(index: int = 0) -> HardwareIdentity:
    import torch

    name = str(torch.cuda.get_device_name(index))
    major, minor = torch.cuda.get_device_capability(index)
    return HardwareIdentity("cuda", slug(f"{name}-sm{major}{minor}"), f"{name} (compute capability {major}.{minor})",
                            {"name": name, "compute_capability": f"{major}.{minor}"})


def npu_identity() -> HardwareIdentity:
    import torch

    name = str(torch.npu.get_device_name())
    return HardwareIdentity("npu", slug(name), name, {"soc": name})


def hardware_identity(device: str) -> HardwareIdentity:
    """The identity of the device under test ("cpu", "cuda" or "npu")."""
    if device == "cuda":
        return cuda_identity()
    if device == "npu":
        return npu_identity()
    if device != "cpu":
        raise ValueError(f"device {device!r}; allowed: cpu, cuda, npu")
    return cpu_identity()


def software(device: str) -> dict[str, str]:
    """The device's software versions a golden records beside the identity (CUDA, CANN)."""
    out: dict[str, str] = {}
    try:
        import torch
    except ImportError:
        return out
    if device == "cuda" and torch.version.cuda:
        out["cuda"] = str(torch.version.cuda)
    if device == "npu":
        try:
            import torch_npu

            from probes.core.versions import versions

            out.update(versions("torch_npu", python=False))
            cann = torch_npu.utils.get_cann_version(module="CANN")  # "" before CANN 8.1.RC1
            if cann:
                out["cann"] = str(cann)
        except Exception:  # the simulated NPU's stand-in, or an older torch_npu
            pass
    return out
