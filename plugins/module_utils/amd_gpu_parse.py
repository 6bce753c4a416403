"""Parse AMD GPU tool output (rocminfo, rocm-smi, amd-smi) and verify a node against an expectation.

Pure Python, standard library only, so that it runs inside an Ansible module on a node and in
unit tests on the controller alike. Every parser accepts the text a tool printed (real captures
live in tests/fixtures/gpu-tools/) and returns a list of partially filled :class:`Gpu` records.

Two layers:

- lenient parsers (:func:`parse_rocminfo`, :func:`parse_rocm_smi`, :func:`parse_amd_smi`) read excerpts,
  pastes and full outputs alike; :func:`merge` and :func:`check` work on what they return;
- :func:`verify_node` is what the ``amd_gpu_facts`` module runs on a node: rocminfo (the HSA runtime's
  view, what PyTorch will see) decides the GPU count and the arch of every GPU agent; rocm-smi and amd-smi
  are cross-checked against it (count, VRAM, partition mode, VF). Output that is cut short or does not parse
  rejects the node, and so does any disagreement between the tools. Every rejection is one line of the form
  ``host1: <what> (likely cause: ...; fix: ...)``.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

# PCI device ids -> product. Sources (docs/rocm.md, "GPU verification"): pci.ids (pciutils/pciids,
# vendor 1002: 74a0 MI300A, 74a1 MI300X, 74a2 MI308X, 74a5 MI325X, 74a9 and 74bd MI300X HF,
# 74b5 MI300X VF, 74b9 MI325X VF)
# and AMD's rocprofiler-compute src/utils/mi_gpu_spec.yaml (chip_ids physical/virtual per gfx942 model:
# MI300X 29857/29877, MI300X HF 29865/29885, MI325X 29861/29881, MI308X 29858/29878, MI300A 29856/29876),
# which names 0x74bd (29885) the virtual function of the MI300X HF.
DEVICE_IDS: dict[str, str] = {
    "0x74a1": "AMD Instinct MI300X",
    "0x74b5": "AMD Instinct MI300X VF",
    "0x74a9": "AMD Instinct MI300X HF",
    "0x74bd": "AMD Instinct MI300X HF VF",
    "0x74a5": "AMD Instinct MI325X",
    "0x74b9": "AMD Instinct MI325X VF",
    "0x74a0": "AMD Instinct MI300A",
    "0x74b4": "AMD Instinct MI300A VF",
    "0x74a2": "AMD Instinct MI308X",
    "0x74b6": "AMD Instinct MI308X VF",
    "0x740f": "AMD Instinct MI210",
    "0x7408": "AMD Instinct MI250X",
    "0x740c": "AMD Instinct MI250X / MI250",
}
VF_DEVICE_IDS = frozenset({"0x74b5", "0x74bd", "0x74b9", "0x74b4", "0x74b6"})

# Product family -> LLVM target, used only when no tool reported the arch directly.
_PRODUCT_ARCH: tuple[tuple[str, str], ...] = (
    (r"MI3[02][0258][XA]?", "gfx942"),
    (r"MI2[15]0X?", "gfx90a"),
    (r"MI100", "gfx908"),
)

# Compute units per logical device for each compute partition mode of the 8-XCD gfx942 parts (MI300X,
# MI300X HF, MI325X: 8 XCDs of 38 CUs; SPX 8 XCDs per device, DPX 4, QPX 2, CPX 1 per mi_gpu_spec.yaml).
MI300X_CU_PARTITION: dict[int, str] = {304: "SPX", 152: "DPX", 76: "QPX", 38: "CPX"}
_CU_PARTITION_PRODUCTS = re.compile(r"\bMI(?:300X|325X)\b", flags=re.IGNORECASE)

PARTITIONS = ("SPX", "DPX", "TPX", "QPX", "CPX")
_GIB = 1024**3
_NA = {"", "N/A", "NA", "NONE"}
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)")


def clean_output(text: str) -> str:
    """Remove what terminals and other platforms add: ANSI colour codes (rocminfo prints them around
    its first line), CR of CRLF line ends, a byte-order mark, NUL bytes."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\x00", "")
    return _ANSI.sub("", text).lstrip("\ufeff")


@dataclass
class Gpu:
    """What the tools told us about one logical GPU; ``None`` means no source reported it."""

    index: int
    arch: str | None = None
    product: str | None = None
    device_id: str | None = None
    is_vf: bool | None = None
    compute_partition: str | None = None
    memory_partition: str | None = None
    vram_bytes: int | None = None
    compute_units: int | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    sources: list[str] = field(default_factory=list)

    @property
    def vram_gib(self) -> float | None:
        """VRAM in GiB, rounded to two decimals."""
        return None if self.vram_bytes is None else round(self.vram_bytes / _GIB, 2)

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly form (adds ``vram_gib``)."""
        data = asdict(self)
        data["vram_gib"] = self.vram_gib
        return data


@dataclass(frozen=True)
class Expectation:
    """What a healthy node looks like; a ``None`` field switches that check off.

    ``products`` is an allow-list: a GPU passes when one entry is a whole word of its product name
    (``MI300X`` matches ``AMD Instinct MI300X`` and ``AMD Instinct MI300X HF``, not ``MI300A``).
    """

    arch: str | None = "gfx942"
    count: int | None = 8
    products: tuple[str, ...] | None = ("MI300X",)
    allow_vf: bool = False
    partition: str | None = "SPX"
    min_vram_gib: float | None = 190.0


# --------------------------------------------------------------------------- helpers


def _clean(value: str) -> str | None:
    value = value.strip().rstrip("\\").strip()
    return None if value.upper() in _NA else value


def _hex_id(value: str | None) -> str | None:
    if not value:
        return None
    match = re.search(r"0x([0-9a-fA-F]{1,4})\b", value)
    return f"0x{match.group(1).lower().zfill(4)}" if match else None


def _number(value: str | None) -> float | None:
    if not value:
        return None
    match = re.search(r"-?\d+(?:\.\d+)?", value)
    return float(match.group(0)) if match else None


def _size_bytes(value: float, unit: str) -> int:
    factor = {"B": 1, "KB": 1024, "MB": 1024**2, "GB": 1024**3, "KIB": 1024, "MIB": 1024**2, "GIB": 1024**3}
    return int(value * factor.get(unit.upper(), 1))


def normalise_product(product: str | None) -> str | None:
    """Turn the many spellings (``MI300X-O``, ``AMD Instinct MI300X OAM``) into one display name."""
    if product is None:
        return None
    text = " ".join(product.split())
    match = re.search(r"MI\d{3}[A-Z]?", text, flags=re.IGNORECASE)
    if not match:
        return text
    model = match.group(0).upper()
    suffix = " HF" if re.search(r"\bHF\b", text) else ""
    suffix += " VF" if re.search(r"\bVF\b", text) else ""
    return f"AMD Instinct {model}{suffix}"


def arch_for_product(product: str | None) -> str | None:
    """LLVM target implied by a product name, or ``None`` when unknown."""
    if not product:
        return None
    for pattern, arch in _PRODUCT_ARCH:
        if re.search(pattern, product, flags=re.IGNORECASE):
            return arch
    return None


def _finish(gpu: Gpu) -> Gpu:
    """Derive what can be derived (product from device id, VF flag, arch from product, partition from CUs)."""
    if gpu.product is None and gpu.device_id in DEVICE_IDS:
        gpu.product = DEVICE_IDS[gpu.device_id]
    if gpu.is_vf is None and (gpu.device_id or gpu.product):
        gpu.is_vf = gpu.device_id in VF_DEVICE_IDS or bool(gpu.product and re.search(r"\bVF\b", gpu.product))
    if (
        gpu.compute_partition is None
        and gpu.compute_units in MI300X_CU_PARTITION
        and gpu.product
        and _CU_PARTITION_PRODUCTS.search(gpu.product)
    ):
        gpu.compute_partition = MI300X_CU_PARTITION[gpu.compute_units]
    return gpu


# --------------------------------------------------------------------------- rocminfo

_ROCMINFO_KEYS = ("Name", "Marketing Name", "Vendor Name", "Device Type", "Uuid", "Chip ID", "Compute Unit")


def _unflatten(text: str) -> str:
    """Restore line breaks in a rocminfo paste whose newlines were lost (two+ spaces before a key)."""
    keys = "|".join(re.escape(k) for k in _ROCMINFO_KEYS)
    return re.sub(rf"\s{{2,}}(?=(?:{keys}):)", "\n", text)


def parse_rocminfo(text: str) -> list[Gpu]:
    """GPU agents from ``rocminfo`` output (full, excerpt, ``grep Name`` or flattened).

    An agent starts at each ``Name:`` line whose value is not an ISA name
    (``amdgcn-amd-amdhsa--gfx942:...``, which also carries ``Name:``). An agent is a GPU when its
    ``Device Type`` is GPU or, in filtered output without that line, when its name is a gfx target.
    """
    text = clean_output(text)
    if any(len(line) > 400 and line.count("Name:") > 2 for line in text.splitlines()):
        text = _unflatten(text)
    agents: list[dict[str, Any]] = []
    for raw in text.splitlines():
        key, sep, value = raw.strip().rstrip("\\").strip().partition(":")
        key, value = key.strip(), value.strip()
        if not sep:
            continue
        if key == "Name" and not value.startswith("amdgcn-"):
            agents.append({"Name": value})
        elif agents:
            _agent_line(agents[-1], key, value)
    gpus: list[Gpu] = []
    for agent in agents:
        gpu = _agent_to_gpu(agent, len(gpus))
        if gpu is not None:
            gpus.append(gpu)
    return gpus


def _agent_line(agent: dict[str, Any], key: str, value: str) -> None:
    """Record one ``key: value`` line of an agent block (ISA names and pool sizes included)."""
    if key == "Name":  # an ISA line: amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-
        agent.setdefault("isa", value)
    elif key == "Segment":
        agent["_segment"] = value
    elif key == "Size" and "vram_kb" not in agent:
        segment = agent.get("_segment", "")
        size = _number(value)
        if "GLOBAL" in segment and "COARSE GRAINED" in segment and size is not None:
            agent["vram_kb"] = int(size)
    elif key in _ROCMINFO_KEYS and key not in agent:
        agent[key] = value


def _agent_to_gpu(agent: dict[str, Any], index: int) -> Gpu | None:
    device_type = agent.get("Device Type")
    name = agent["Name"]
    is_gpu = device_type == "GPU" if device_type else bool(re.fullmatch(r"gfx[0-9a-f]+", name))
    if not is_gpu:
        return None
    cu = _number(agent.get("Compute Unit"))
    return _finish(
        Gpu(
            index=index,
            arch=name.split(":")[0] if name.startswith("gfx") else None,
            product=_clean(agent.get("Marketing Name", "")),
            device_id=_hex_id(agent.get("Chip ID")),
            vram_bytes=agent["vram_kb"] * 1024 if "vram_kb" in agent else None,
            compute_units=int(cu) if cu is not None else None,
            sources=["rocminfo"],
        )
    )


# --------------------------------------------------------------------------- rocm-smi

_SMI_KV = re.compile(r"^GPU\[(\d+)\]\s*:\s*(.+?):\s*(.*)$")
_CONCISE_ROW = re.compile(r"^(\d+)\s+\S")
_PARTITION = re.compile(r"\b(NPS\d|N/A),\s*(SPX|DPX|TPX|QPX|CPX|N/A)\b")


def parse_rocm_smi(text: str) -> list[Gpu]:
    """Devices from ``rocm-smi`` text: concise table (6.1 and 6.2+ layouts), ``--showproductname``,
    ``--showmeminfo vram``, ``-i`` and ``-a`` sections; several outputs may be concatenated."""
    text = clean_output(text)
    by_index: dict[int, Gpu] = {}

    def get(index: int) -> Gpu:
        return by_index.setdefault(index, Gpu(index=index, sources=["rocm-smi"]))

    in_concise = False
    last_row: Gpu | None = None
    for raw in text.replace("\t", " ").splitlines():
        line = raw.rstrip()
        header = re.match(r"^=+ (.+?) =+$", line)
        if header:
            in_concise = header.group(1) == "Concise Info"
            continue
        kv = _SMI_KV.match(line.strip())
        if kv:
            gpu = get(int(kv.group(1)))
            _smi_key_value(gpu, kv.group(2).strip().lower(), kv.group(3).strip())
            continue
        if not in_concise or line.startswith("="):
            continue
        row = _CONCISE_ROW.match(line)
        if row and ("°C" in line or "W " in line or "Mhz" in line):
            last_row = get(int(row.group(1)))
            _smi_concise_row(last_row, line)
            continue
        name = line.strip()
        if last_row is not None and name and line[:1].isspace() and not name.startswith("("):
            last_row.product = last_row.product or name
            last_row = None
    return [_finish(by_index[i]) for i in sorted(by_index)]


def _smi_concise_row(gpu: Gpu, line: str) -> None:
    temp = re.search(r"(-?\d+(?:\.\d+)?)°C", line)
    if temp:
        gpu.temperature_c = float(temp.group(1))
    power = re.search(r"\s(\d+(?:\.\d+)?)W\s", line + " ")
    if power:
        gpu.power_w = float(power.group(1))
    part = _PARTITION.search(line)
    if part:
        gpu.memory_partition = _clean(part.group(1))
        gpu.compute_partition = _clean(part.group(2))
    gpu.device_id = gpu.device_id or _hex_id(line.split("°C", maxsplit=1)[0])


def _smi_key_value(gpu: Gpu, key: str, value: str) -> None:
    if key in {"card series", "device name", "card model name"}:
        gpu.product = _clean(value) or gpu.product
    elif key in {"card model", "device id"} and gpu.device_id is None:
        gpu.device_id = _hex_id(value)
    elif key == "gfx version":
        gpu.arch = _clean(value)
    elif key == "vram total memory (b)":
        number = _number(value)
        gpu.vram_bytes = int(number) if number is not None else None
    elif key.startswith("temperature (sensor junction)"):
        gpu.temperature_c = _number(value)
    elif key in {"current socket graphics package power (w)", "average graphics package power (w)"}:
        gpu.power_w = _number(value)
    elif key in {"compute partition", "current compute partition"}:
        gpu.compute_partition = _clean(value.upper())
    elif key in {"memory partition", "current memory partition"}:
        gpu.memory_partition = _clean(value.upper())


# --------------------------------------------------------------------------- amd-smi


def parse_amd_smi(text: str) -> list[Gpu]:
    """Devices from ``amd-smi`` output: ``--json`` (a list or ``{"gpu_data": [...]}``), the text of
    ``list`` / ``static`` / ``metric`` (``GPU: N`` blocks), or the default table."""
    text = clean_output(text)
    stripped = text.strip()
    if stripped.startswith(("{", "[")) or _json_start(text) is not None:
        return parse_amd_smi_json(text)
    if "Partition-Mode" in text or "GPU-Name" in text:
        return _parse_amd_smi_table(text)
    if re.search(r"^\s*(?:TIMESTAMP\s+)?GPU\s+POWER\b", text, flags=re.MULTILINE):
        return _parse_amd_smi_monitor(text)
    return _parse_amd_smi_blocks(text)


def _parse_amd_smi_blocks(text: str) -> list[Gpu]:
    gpus: list[Gpu] = []
    current: Gpu | None = None
    section = ""
    for raw in text.splitlines():
        if not raw.strip():
            continue
        indent = len(raw) - len(raw.lstrip())
        key, sep, value = raw.strip().partition(":")
        if not sep:
            continue
        key = key.strip().upper()
        value = value.strip()
        if indent == 0:
            current = None
            if key == "GPU":
                current = Gpu(index=int(value), sources=["amd-smi"])
                gpus.append(current)
            continue
        if current is None:
            continue
        if not value:
            section = key
            continue
        _amd_smi_field(current, section, key, value)
    return [_finish(g) for g in gpus]


def _amd_smi_field(gpu: Gpu, section: str, key: str, value: str) -> None:
    if key == "MARKET_NAME":
        gpu.product = _clean(value)
    elif key == "DEVICE_ID":
        gpu.device_id = _hex_id(value)
    elif key == "TARGET_GRAPHICS_VERSION":
        gpu.arch = _clean(value)
    elif key == "UUID" and gpu.device_id is None:
        # amd-smi UUIDs embed the PCI device id: d4ff74a1-0000-... -> 0x74a1
        match = re.match(r"^[0-9a-f]{4}([0-9a-f]{4})-", value)
        gpu.device_id = f"0x{match.group(1)}" if match else None
    elif key == "NUM_COMPUTE_UNITS":
        number = _number(value)
        gpu.compute_units = int(number) if number is not None else None
    elif key in {"COMPUTE_PARTITION", "ACCELERATOR_PARTITION"}:  # renamed in amd-smi of ROCm 6.4.2
        gpu.compute_partition = _clean(value.upper())
    elif key == "MEMORY_PARTITION":
        gpu.memory_partition = _clean(value.upper())
    elif key == "SIZE" and section == "VRAM":
        match = re.match(r"(\d+(?:\.\d+)?)\s*([KMG]i?B)", value)
        if match:
            gpu.vram_bytes = _size_bytes(float(match.group(1)), match.group(2))
    elif key == "SOCKET_POWER" and section == "POWER":
        gpu.power_w = _number(value)
    elif key in {"HOTSPOT", "JUNCTION"} and section == "TEMPERATURE":
        gpu.temperature_c = _number(value)


def _parse_amd_smi_table(text: str) -> list[Gpu]:
    gpus: list[Gpu] = []
    rows = [line for line in text.splitlines() if line.startswith("|")]
    for first, second in itertools.pairwise(rows):
        head = re.match(r"^\|\s*([0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.\d)\s+(.+?)\s*\|", first)
        if not head:
            continue
        # Partition-Mode is "SPX/NPS1", or "N/A" on the secondary partitions of a partitioned GPU
        ids = re.match(r"^\|\s*(\d+)\s+\S+\s+\S+\s+(?:(\w+)/(\w+)|N/A)\s*\|", second)
        gpu = Gpu(index=int(ids.group(1)) if ids else len(gpus), product=head.group(2), sources=["amd-smi"])
        if ids and ids.group(2):
            gpu.compute_partition, gpu.memory_partition = ids.group(2).upper(), ids.group(3).upper()
        temp = re.search(r"(\d+(?:\.\d+)?)\s*°C", first)
        gpu.temperature_c = float(temp.group(1)) if temp else None
        power = re.search(r"(\d+(?:\.\d+)?)/\d+\s*W", first)
        gpu.power_w = float(power.group(1)) if power else None
        mem = re.search(r"\d+/(\d+)\s*MB", second)
        gpu.vram_bytes = _size_bytes(float(mem.group(1)), "MB") if mem else None
        gpus.append(_finish(gpu))
    return gpus


def _parse_amd_smi_monitor(text: str) -> list[Gpu]:
    """``amd-smi monitor`` rows: ``[timestamp] gpu  182 W  42 °C ...  2.0/192.0 GB``."""
    with_timestamp = bool(re.search(r"^\s*TIMESTAMP\s+GPU", text, flags=re.MULTILINE))
    row = re.compile(r"^\s*(?:\d{9,}\s+)?(\d+)\s+(\d+(?:\.\d+)?)\s*W\s+(\d+(?:\.\d+)?)\s*°C")
    by_index: dict[int, Gpu] = {}
    for line in text.splitlines():
        if with_timestamp and not re.match(r"^\s*\d{9,}\s", line):
            continue
        match = row.match(line)
        if not match or int(match.group(1)) in by_index:
            continue
        gpu = Gpu(index=int(match.group(1)), sources=["amd-smi"])
        gpu.power_w, gpu.temperature_c = float(match.group(2)), float(match.group(3))
        vram = re.search(r"/(\d+(?:\.\d+)?)\s*GB\s*$", line)
        gpu.vram_bytes = _size_bytes(float(vram.group(1)), "GB") if vram else None
        by_index[gpu.index] = gpu
    return [by_index[i] for i in sorted(by_index)]


def _dig(data: Any, *path: str) -> Any:  # noqa: ANN401 - walks untyped JSON
    for key in path:
        if not isinstance(data, dict):
            return None
        data = data.get(key)
    return data


def _json_size(value: Any) -> int | None:  # noqa: ANN401 - untyped JSON
    if isinstance(value, dict) and "value" in value:
        number = _number(str(value["value"]))
        return _size_bytes(number, str(value.get("unit", "MB"))) if number is not None else None
    if isinstance(value, int | float):
        return _size_bytes(float(value), "MB")
    if isinstance(value, str):
        match = re.match(r"(\d+(?:\.\d+)?)\s*([KMG]i?B)?", value)
        if match:
            return _size_bytes(float(match.group(1)), match.group(2) or "MB")
    return None


_NOISE_LINE = re.compile(r"^\s*[^\s\[{]")


def _json_start(text: str) -> int | None:
    """Offset of the first line that opens a JSON document, when only non-JSON lines precede it (amd-smi
    prints ``WARNING: User is missing the following required groups: ...`` to stdout before its JSON)."""
    match = re.search(r"^[ \t]*[\[{]", text, flags=re.MULTILINE)
    if match is None:
        return None
    before = text[: match.start()].splitlines()
    return match.start() if all(not line.strip() or _NOISE_LINE.match(line) for line in before) else None


def load_amd_smi_json(text: str) -> Any:  # noqa: ANN401 - untyped JSON
    """The JSON document amd-smi printed, after the noise lines before it; raises :class:`ToolOutputError`
    naming where the JSON breaks off or is malformed."""
    text = clean_output(text)
    start = _json_start(text)
    if start is None:
        raise ToolOutputError("no JSON document in the output (first line: " + _first_line(text, 80) + ")")
    body = text[start:].rstrip()
    try:
        data, end = json.JSONDecoder().raw_decode(body)
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno} column {exc.colno} (char {exc.pos} of {len(body)})"
        if exc.pos >= len(body) - 1 or exc.msg.startswith("Unterminated"):
            raise ToolOutputError(f"JSON cut short: {exc.msg} at {where}") from None
        raise ToolOutputError(f"invalid JSON: {exc.msg} at {where}") from None
    if body[end:].strip():
        raise ToolOutputError(f"text after the JSON document: {_first_line(body[end:], 60)}")
    return data


def parse_amd_smi_json(text: str) -> list[Gpu]:
    """``amd-smi <list|static|metric> --json``: a list of per-GPU objects or ``{"gpu_data": [...]}`` (amd-smi
    26.x, ``combine_arrays_to_json``). Reads ``partition.accelerator_partition`` (ROCm 6.4.2+) and the older
    ``partition.compute_partition``; unknown fields are ignored."""
    data = load_amd_smi_json(text)
    if isinstance(data, dict):
        data = data.get("gpu_data", [data] if "gpu" in data else [])
    gpus: list[Gpu] = []
    for position, item in enumerate(data if isinstance(data, list) else []):
        if not isinstance(item, dict):
            continue
        index = item.get("gpu", position)
        gpu = Gpu(index=int(index) if isinstance(index, int | str) else position, sources=["amd-smi"])
        market = _dig(item, "asic", "market_name")
        gpu.product = _clean(str(market)) if market is not None else None
        gpu.device_id = _hex_id(str(_dig(item, "asic", "device_id") or ""))
        arch = _dig(item, "asic", "target_graphics_version")
        gpu.arch = _clean(str(arch)) if arch is not None else None
        cus = _dig(item, "asic", "num_compute_units")
        gpu.compute_units = int(cus) if isinstance(cus, int) and not isinstance(cus, bool) else None
        vram = _dig(item, "vram", "size")
        if vram is None:
            vram = _dig(item, "mem_usage", "total_vram")
        gpu.vram_bytes = _json_size(vram) if vram is not None else None
        part = _dig(item, "partition", "accelerator_partition")
        if part is None:
            part = _dig(item, "partition", "compute_partition")
        gpu.compute_partition = _clean(str(part).upper()) if part is not None else None
        mpart = _dig(item, "partition", "memory_partition")
        gpu.memory_partition = _clean(str(mpart).upper()) if mpart is not None else None
        uuid = item.get("uuid")
        if gpu.device_id is None and isinstance(uuid, str):
            match = re.match(r"^[0-9a-f]{4}([0-9a-f]{4})-", uuid)
            gpu.device_id = f"0x{match.group(1)}" if match else None
        gpus.append(_finish(gpu))
    return gpus


# --------------------------------------------------------------------------- dkms


@dataclass(frozen=True)
class DkmsEntry:
    """One line of ``dkms status``."""

    module: str
    version: str
    kernel: str | None
    state: str


_DKMS_LINE = re.compile(r"^([\w.-]+)[/,]\s*([^,]+?)(?:,\s*([^,]+?))?(?:,\s*[^,:]+)?:\s*(\w[\w ()-]*)$")


def parse_dkms_status(text: str) -> list[DkmsEntry]:
    """``amdgpu/6.12.12-2187269.el9, 5.14.0-570...x86_64, x86_64: installed`` -> entries."""
    entries: list[DkmsEntry] = []
    for line in text.splitlines():
        match = _DKMS_LINE.match(line.strip())
        if match:
            module, version, kernel, state = match.groups()
            kernel = kernel.strip() if kernel else None
            entries.append(DkmsEntry(module, version.strip(), kernel, state.strip()))
    return entries


# --------------------------------------------------------------------------- merge and check


def merge(*sources: list[Gpu]) -> list[Gpu]:
    """Combine per-tool lists by index. The source listing the most devices sets the count
    (rocminfo may be cut short; CPX nodes list 64 devices in rocm-smi); the others fill gaps."""
    non_empty = [s for s in sources if s]
    if not non_empty:
        return []
    primary = max(non_empty, key=len)
    merged: list[Gpu] = []
    for gpu in primary:
        combined = Gpu(index=gpu.index)
        for source in [primary, *[s for s in non_empty if s is not primary]]:
            other = next((g for g in source if g.index == gpu.index), None)
            if other is None:
                continue
            for item in fields(Gpu):
                if item.name in {"index", "sources"}:
                    continue
                if getattr(combined, item.name) is None and getattr(other, item.name) is not None:
                    setattr(combined, item.name, getattr(other, item.name))
            combined.sources.extend(s for s in other.sources if s not in combined.sources)
        combined.product = normalise_product(combined.product)
        if combined.arch is None:
            combined.arch = arch_for_product(combined.product)
        merged.append(combined)
    return merged


_MAX_LINES_PER_CHECK = 2
_FIX_PARTITION = (
    "run `amd-smi set --compute-partition {want}` (and `amd-smi set --memory-partition NPS1`) as root, "
    "or reload amdgpu or reboot: the driver starts in SPX"
)


def check(host: str, gpus: list[Gpu], expect: Expectation) -> list[str]:
    """One-line failure messages; an empty list means the node is what ``expect`` describes."""
    if not gpus:
        want = expect.count if expect.count is not None else "at least 1"
        return [
            f"{host}: GPU count 0, expected {want} (likely cause: amdgpu driver not loaded or the user "
            "is not in the render/video groups; check `dkms status`, `lsmod | grep amdgpu`, /dev/kfd)"
        ]
    failures: list[str] = []
    if expect.count is not None and len(gpus) != expect.count:
        partitioned = [g.compute_partition for g in gpus if g.compute_partition not in {None, "SPX"}]
        cause = (
            f"the GPUs are in {partitioned[0]} compute partition mode, which splits each MI300X "
            "into several logical devices (CPX shows 64 on an 8-GPU node)"
            if partitioned and len(gpus) > expect.count
            else "a GPU is missing from the bus or failed to initialise; fix: check `dmesg | grep -i amdgpu` "
            "and `amd-smi list`, reseat or replace the GPU, or set gpu_verify_expected_count"
        )
        if partitioned and len(gpus) > expect.count:
            cause += "; fix: " + _FIX_PARTITION.format(want=expect.partition or "SPX")
        failures.append(f"{host}: GPU count {len(gpus)}, expected {expect.count} (likely cause: {cause})")
    per_check: dict[str, list[tuple[int, str]]] = {}
    for gpu in gpus:
        for kind, message in _gpu_failures(gpu, expect):
            per_check.setdefault(kind, []).append((gpu.index, message))
    for kind, items in per_check.items():
        failures.extend(f"{host}: GPU {index}: {message}" for index, message in items[:_MAX_LINES_PER_CHECK])
        rest = [index for index, _ in items[_MAX_LINES_PER_CHECK:]]
        if rest:
            failures.append(f"{host}: GPU {_ranges(rest)}: same {kind} failure ({len(rest)} more GPUs)")
    return failures


def _ranges(indexes: list[int]) -> str:
    """[2, 3, 4, 7] -> "2-4,7"."""
    parts: list[str] = []
    start = prev = indexes[0]
    for index in [*indexes[1:], None]:
        if index is not None and index == prev + 1:
            prev = index
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if index is not None:
            start = prev = index
    return ",".join(parts)


def _gpu_failures(gpu: Gpu, expect: Expectation) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    product = gpu.product or "unknown product"
    if expect.arch is not None and gpu.arch != expect.arch:
        if gpu.arch is None:
            detail = (
                f"arch unknown ({product}), expected {expect.arch} (likely cause: no tool reported the GPU's "
                "LLVM target; fix: check `rocminfo | grep gfx`)"
            )
        else:
            detail = (
                f"arch {gpu.arch} ({product}), expected {expect.arch} (likely cause: a GPU of another "
                f"generation; code objects built for {expect.arch} (torch, flash-attn, DeepSpeed ops) fail "
                "on it with hipErrorNoBinaryForGPU; fix: use nodes with "
                f"{expect.arch} GPUs, or set gpu_verify_expected_arch if this node is meant to differ)"
            )
        out.append(("arch", detail))
    # a wrong arch already names the product, so the product check only speaks for a right arch
    if not out and expect.products is not None and not _product_allowed(gpu.product, expect.products):
        out.append(
            (
                "product",
                f"product {gpu.product or 'unknown'}, expected one of {', '.join(expect.products)} "
                "(likely cause: another Instinct model of the same arch in this node; fix: add it to "
                "gpu_verify_allowed_products if the jobs' memory plans fit it)",
            )
        )
    if not expect.allow_vf and gpu.is_vf:
        out.append(
            (
                "vf",
                f"virtual function ({product}, device {gpu.device_id or 'unknown'}), VF not allowed "
                "(likely cause: a VM guest with an SR-IOV GPU; fix: use bare-metal nodes, or set "
                "gpu_verify_allow_vf: true to accept)",
            )
        )
    # partition modes are a property of the expected arch's parts; a wrong arch already says enough
    if expect.partition is not None and not (out and out[0][0] == "arch"):
        mode = gpu.compute_partition
        if mode is None:
            out.append(
                (
                    "partition",
                    f"partition unknown, expected {expect.partition} (likely cause: no tool reported the "
                    "compute partition mode (amd-smi missing or older than ROCm 6.4.2, no rocm-smi, and a "
                    "product whose CU count does not tell it); fix: install amd-smi-lib and check "
                    "`amd-smi static --partition`)",
                )
            )
        elif mode not in PARTITIONS:
            out.append(
                (
                    "partition",
                    f"partition {mode!r} is not a compute partition mode ({', '.join(PARTITIONS)}), expected "
                    f"{expect.partition} (likely cause: a tool version this parser does not know; fix: check "
                    "`amd-smi static --partition` by hand)",
                )
            )
        elif mode != expect.partition:
            out.append(
                (
                    "partition",
                    f"partition {mode}, expected {expect.partition} (likely cause: compute partitioning was "
                    "changed; fix: " + _FIX_PARTITION.format(want=expect.partition) + ")",
                )
            )
    if expect.min_vram_gib is not None and gpu.vram_gib is not None and gpu.vram_gib < expect.min_vram_gib:
        out.append(
            (
                "vram",
                f"VRAM {gpu.vram_gib} GiB, expected at least {expect.min_vram_gib} GiB (likely cause: "
                "a memory or compute partition mode, or a different model; fix: `amd-smi static --partition "
                "--vram` shows which)",
            )
        )
    return out


def _product_allowed(product: str | None, allowed: tuple[str, ...]) -> bool:
    return bool(product) and any(
        re.search(rf"\b{re.escape(name)}\b", product or "", flags=re.IGNORECASE) for name in allowed
    )


def _fmt(value: float | str | None, unit: str = "") -> str:
    if value is None:
        return "-"
    return f"{value:g}{unit}" if isinstance(value, float) else f"{value}{unit}"


def format_table(host: str, gpus: list[Gpu]) -> str:
    """Per-host table: GPU, arch, product, partition, VRAM, temperature, power."""
    header = ("GPU", "ARCH", "PRODUCT", "PART", "VRAM", "TEMP", "POWER")
    rows = [
        (
            str(g.index),
            g.arch or "-",
            g.product or "-",
            g.compute_partition or "-",
            _fmt(g.vram_gib, " GiB"),
            _fmt(g.temperature_c, " C"),
            _fmt(g.power_w, " W"),
        )
        for g in gpus
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [f"{host}: {len(gpus)} GPUs"]
    lines += ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(r)).rstrip() for r in [header, *rows]]
    return "\n".join(lines)


# --------------------------------------------------------------------------- node verification


class ToolOutputError(ValueError):
    """A tool's output that cannot be used: cut short, malformed, or not the expected document."""


def _first_line(text: str, width: int = 120) -> str:
    line = next((item.strip() for item in clean_output(text).splitlines() if item.strip()), "")
    return line if len(line) <= width else line[: width - 3] + "..."


@dataclass(frozen=True)
class ToolRun:
    """One command the module ran: ``rc`` None means the tool is not installed."""

    tool: str
    command: str
    rc: int | None
    stdout: str = ""
    stderr: str = ""


@dataclass
class Verdict:
    """What :func:`verify_node` decided: the GPUs (rocminfo's, completed by the other tools), one line per
    problem, and per command its return code, GPU count and error."""

    gpus: list[Gpu]
    failures: list[str]
    tools: dict[str, dict[str, Any]]


ROCMINFO_DONE = "*** Done ***"  # rocminfo.cc main(): printed only after every agent was listed
ROCM_SMI_END = "End of ROCm SMI Log"  # rocm_smi.py: printed after every report
CROSS_TOOLS = ("rocm-smi", "amd-smi")
NOT_INSTALLED_RC = 127  # what a shell returns for a command it cannot find
_VRAM_TOLERANCE = 0.02


def read_rocminfo(text: str) -> list[Gpu]:
    """GPU agents of a complete rocminfo run; raises :class:`ToolOutputError` for output that stops before
    rocminfo's closing line (cut short, or an HSA call failed part-way)."""
    text = clean_output(text)
    gpus = parse_rocminfo(text)
    if ROCMINFO_DONE not in text:
        raise ToolOutputError(
            f"cut short: the output ends after {len(gpus)} GPU agents without rocminfo's closing "
            f"'{ROCMINFO_DONE}' line"
        )
    if "HSA Agents" not in text:
        raise ToolOutputError(f"no 'HSA Agents' section (first line: {_first_line(text, 80)!r})")
    return gpus


def read_rocm_smi(text: str) -> list[Gpu]:
    """Devices of a complete rocm-smi report; raises :class:`ToolOutputError` when the report's closing
    line is missing (cut short)."""
    text = clean_output(text)
    if ROCM_SMI_END not in text:
        gpus = parse_rocm_smi(text)
        raise ToolOutputError(
            f"cut short: the report ends after {len(gpus)} devices without rocm-smi's closing "
            f"'{ROCM_SMI_END}' line"
        )
    return parse_rocm_smi(text)


def read_amd_smi(text: str) -> list[Gpu]:
    """Devices of ``amd-smi static ... --json``; raises :class:`ToolOutputError` for JSON that is cut short,
    malformed, or not a list of per-GPU objects."""
    data = load_amd_smi_json(text)
    items = data.get("gpu_data") if isinstance(data, dict) else data
    if not isinstance(items, list):
        raise ToolOutputError(f"expected a list of GPUs or {{'gpu_data': [...]}}, got {type(data).__name__}")
    for position, item in enumerate(items):
        if (
            not isinstance(item, dict)
            or not isinstance(item.get("gpu"), int)
            or isinstance(item["gpu"], bool)
        ):
            raise ToolOutputError(f"GPU entry {position} has no integer 'gpu' key")
    return parse_amd_smi_json(text)


_READERS = {"rocminfo": read_rocminfo, "rocm-smi": read_rocm_smi, "amd-smi": read_amd_smi}

_DRIVER_FIX = (
    "check `dkms status` and `lsmod | grep amdgpu`, install amdgpu-dkms with the headers of the running "
    "kernel (rocm role), then reboot"
)


def diagnose(text: str) -> tuple[str, str, str] | None:
    """(what, likely cause, fix) for the error messages rocminfo, rocm-smi and amd-smi print on a broken
    node (rocminfo.cc CheckInitialState and RET_IF_HSA_ERR; amd-smi/rocm-smi driver checks); None when the
    text carries none of them."""
    text = clean_output(text)
    driver = re.search(
        r"^.*(?:ROCk module is NOT (?:loaded|live)|amdgpu not found in modules|"
        r"/sys/module/amdgpu/initstate: No such file|Unable to detect any GPU devices).*$",
        text,
        flags=re.MULTILINE,
    )
    if driver:
        return (
            f"the amdgpu driver is not loaded ({driver.group(0).strip()!r})",
            "amdgpu-dkms is not built or not loaded for the running kernel, or the node was not rebooted "
            "after the driver install",
            _DRIVER_FIX,
        )
    kfd = re.search(r"Unable to open /dev/kfd read-write: ([^\n]+)", text)
    if kfd:
        err = kfd.group(1).strip()
        member = re.search(r'^(\S+) is not member of "([\w-]+)" group', text, flags=re.MULTILINE)
        if member or "Permission denied" in err:
            who = (
                f"user {member.group(1)} is not in the {member.group(2)} group"
                if member
                else "the user running the tools is not in the render and video groups"
            )
            return (
                f"cannot open /dev/kfd ({err})",
                f"{who} (the groups that own /dev/kfd and /dev/dri/renderD*)",
                "add the user to render and video (rocm_users does) and start a new login session: "
                "group membership applies to new logins only",
            )
        if "No such file" in err:
            return (f"cannot open /dev/kfd ({err})", "the amdgpu driver is not loaded", _DRIVER_FIX)
        return (
            f"cannot open /dev/kfd ({err})",
            "/dev/kfd exists but the kernel refuses it: a container or VM without the GPU passed through, "
            "or a GPU this amdgpu does not drive",
            "run on the host or pass /dev/kfd and /dev/dri into the container; check `dmesg | grep -i kfd`",
        )
    hsa = re.search(r"hsa api call failure at: \S*?([^/\s]+:\d+)\s*\n\s*Call returned ([^\n]+)", text)
    if hsa:
        return (
            f"an HSA runtime call failed part-way ({hsa.group(2).strip()}, at {hsa.group(1)})",
            "a GPU failed to initialise in the ROCm runtime while the driver lists it, or a GPU that ROCm "
            "does not support is in the node (rocminfo then exits with the HSA status, 0 for "
            "HSA_STATUS_ERROR)",
            "check `dmesg | grep -i amdgpu`, remove or isolate the unsupported GPU, reboot",
        )
    return None


def _tool_line(host: str, run: ToolRun, what: str, cause: str, fix: str) -> str:
    return f"{host}: {run.tool} ({run.command}): {what} (likely cause: {cause}; fix: {fix})"


def _read(host: str, run: ToolRun, record: dict[str, Any]) -> tuple[list[Gpu] | None, str | None]:
    """The GPUs one command reported, or the line that rejects the node because of it."""
    diagnosis = diagnose(f"{run.stdout}\n{run.stderr}")
    if diagnosis is not None:
        record["error"] = diagnosis[0]
        return None, _tool_line(host, run, *diagnosis)
    if run.rc:
        first = _first_line(run.stderr) or _first_line(run.stdout) or "no output"
        record["error"] = first
        return None, _tool_line(
            host,
            run,
            f"exited {run.rc}: {first}",
            "the tool cannot read the GPUs (driver, firmware or a broken ROCm install)",
            f"run `{run.command}` by hand and check `dmesg | grep -i amdgpu`",
        )
    try:
        gpus = _READERS[run.tool](run.stdout)
    except ToolOutputError as exc:
        error = str(exc)
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, RecursionError) as exc:
        error = f"{type(exc).__name__}: {exc}"
    else:
        return gpus, None
    record["error"] = f"unparsable output: {error}"
    return None, (
        f"{host}: {run.tool} exited 0 but its output does not parse ({run.command}): {error} (likely cause: "
        "the tool was interrupted or died part-way, or a release changed its format; fix: run "
        f"`{run.command}` by hand and compare with docs/rocm.md)"
    )


def _count_line(host: str, counts: dict[str, int], visible_env: Mapping[str, str]) -> str:
    seen = ", ".join(f"{tool} sees {count}" for tool, count in counts.items() if tool != "rocminfo")
    base = counts["rocminfo"]
    env = ", ".join(f"{key}={value}" for key, value in visible_env.items())
    if base < max(counts.values()):
        cause = (
            f"{env} hides GPUs from ROCm programs"
            if env
            else "a GPU failed to initialise in the ROCm (HSA) runtime while the driver still lists it, or "
            "ROCR_VISIBLE_DEVICES/HIP_VISIBLE_DEVICES hides it from ROCm programs"
        )
        fix = (
            "unset ROCR_VISIBLE_DEVICES and HIP_VISIBLE_DEVICES in the users' environment, check "
            "`dmesg | grep -i amdgpu`, reboot the node"
        )
    else:
        cause = "a tool cannot read every GPU the HSA runtime lists (driver or firmware error on one GPU)"
        fix = "check `dmesg | grep -i amdgpu` and `amd-smi list`, reboot the node"
    return f"{host}: GPU count disagrees: rocminfo sees {base} GPUs, {seen} (likely cause: {cause}; " + (
        f"fix: {fix})"
    )


def _distinct(values: list[Any]) -> str:
    return "/".join(str(v) for v in sorted(set(values), key=str))


def _cross_check(host: str, base: list[Gpu], others: dict[str, list[Gpu]]) -> list[str]:
    """Lines for VRAM, partition mode and VF status that rocminfo and a tool report differently."""
    lines: list[str] = []
    base_vram = sorted(g.vram_gib for g in base if g.vram_gib is not None)
    for tool, gpus in others.items():
        vram = sorted(g.vram_gib for g in gpus if g.vram_gib is not None)
        if len(vram) == len(base_vram) == len(base) and any(
            abs(a - b) > _VRAM_TOLERANCE * max(a, b) for a, b in zip(base_vram, vram, strict=True)
        ):
            lines.append(
                f"{host}: VRAM per GPU disagrees: rocminfo reports {_distinct(base_vram)} GiB, {tool} "
                f"{_distinct(vram)} GiB (likely cause: a memory partition mode the tools account "
                "differently, or a GPU with failed memory; fix: check `amd-smi static --vram --partition` "
                "and `dmesg | grep -i amdgpu`)"
            )
    reported = {
        tool: [g.compute_partition for g in gpus]
        for tool, gpus in others.items()
        if gpus and all(g.compute_partition is not None for g in gpus)
    }
    inferred = [g.compute_partition for g in base]
    if all(mode is not None for mode in inferred):
        cus = _distinct([g.compute_units for g in base])
        reported = {f"rocminfo ({cus} CUs per GPU)": inferred, **reported}
    if len({_distinct(modes) for modes in reported.values()}) > 1:
        said = ", ".join(f"{tool} {_distinct(modes)}" for tool, modes in reported.items())
        lines.append(
            f"{host}: compute partition disagrees: {said} (likely cause: the mode changed without the "
            "driver reloading, or a tool misreads it; fix: run `amd-smi set --compute-partition SPX` as root "
            "and reboot, then compare `amd-smi static --partition` with `rocminfo`)"
        )
    base_vf = sum(1 for g in base if g.is_vf)
    for tool, gpus in others.items():
        if any(g.is_vf is not None for g in gpus) and sum(1 for g in gpus if g.is_vf) != base_vf:
            lines.append(
                f"{host}: VF status disagrees: rocminfo reports {base_vf} virtual functions, {tool} "
                f"{sum(1 for g in gpus if g.is_vf)} (likely cause: a device id or product name one tool does "
                "not know; fix: compare `rocminfo | grep -e Marketing -e Chip` with `amd-smi static --asic`)"
            )
    return lines


def _complete(base: list[Gpu], others: dict[str, list[Gpu]]) -> list[Gpu]:
    """rocminfo's GPUs with what the other tools add by index; a partition mode a tool reports replaces the
    one inferred from compute units."""
    for gpu in base:
        for tool, gpus in others.items():
            other = next((g for g in gpus if g.index == gpu.index), None)
            if other is None:
                continue
            if other.compute_partition is not None and tool == "amd-smi":
                gpu.compute_partition = other.compute_partition
            for item in fields(Gpu):
                if item.name in {"index", "sources"}:
                    continue
                if getattr(gpu, item.name) is None and getattr(other, item.name) is not None:
                    setattr(gpu, item.name, getattr(other, item.name))
            gpu.sources.extend(s for s in other.sources if s not in gpu.sources)
        gpu.product = normalise_product(gpu.product)
        if gpu.arch is None:
            gpu.arch = arch_for_product(gpu.product)
    return base


def verify_node(
    host: str,
    runs: list[ToolRun],
    expect: Expectation,
    *,
    visible_env: Mapping[str, str] | None = None,
) -> Verdict:
    """Decide whether a node is what ``expect`` describes, from the commands the module ran.

    rocminfo decides the GPU count and the arch of every GPU; rocm-smi and amd-smi must agree with it.
    ``visible_env`` holds ROCR_VISIBLE_DEVICES and friends as set for the tools, named in the count line.
    """
    tools: dict[str, dict[str, Any]] = {}
    failures: list[str] = []
    base: list[Gpu] | None = None
    others: dict[str, list[Gpu]] = {}
    for run in runs:
        record: dict[str, Any] = {"rc": run.rc, "error": ""}
        tools[run.command] = record
        if run.rc is None or (run.rc == NOT_INSTALLED_RC and run.tool in CROSS_TOOLS):
            record["error"] = "not installed"
            if run.tool == "rocminfo":
                failures.append(
                    f"{host}: rocminfo not found ({run.command}) (likely cause: the rocm role has not run "
                    "here, or rocm_packages lacks rocminfo; fix: run playbooks/rocm.yml)"
                )
            continue
        gpus, line = _read(host, run, record)
        if line is not None:
            failures.append(line)
            continue
        assert gpus is not None  # _read returns one of the two
        record["gpus"] = len(gpus)
        if run.tool == "rocminfo":
            base = gpus
        else:
            others[run.tool] = _merge_same_tool(others.get(run.tool), gpus)
    if base is None:
        return Verdict([], failures, tools)
    counts = {"rocminfo": len(base), **{tool: len(gpus) for tool, gpus in others.items()}}
    if len(set(counts.values())) > 1:
        failures.append(_count_line(host, counts, visible_env or {}))
        return Verdict(_complete(base, {}), failures, tools)
    failures += _cross_check(host, base, others)
    gpus = _complete(base, others)
    failures += check(host, gpus, expect)
    return Verdict(gpus, failures, tools)


def _merge_same_tool(first: list[Gpu] | None, second: list[Gpu]) -> list[Gpu]:
    """Two reports of one tool (``rocm-smi`` and ``rocm-smi --showmeminfo vram``) as one list by index."""
    if not first:
        return second
    by_index = {g.index: g for g in first}
    for gpu in second:
        known = by_index.setdefault(gpu.index, gpu)
        for item in fields(Gpu):
            if item.name not in {"index", "sources"} and getattr(known, item.name) is None:
                setattr(known, item.name, getattr(gpu, item.name))
    return [by_index[i] for i in sorted(by_index)]
