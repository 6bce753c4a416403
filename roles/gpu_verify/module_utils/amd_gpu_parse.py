"""Parse AMD GPU tool output (rocminfo, rocm-smi, amd-smi) and check it against an expectation.

Pure Python, standard library only, so that it runs inside an Ansible module on a node and in
unit tests on the controller alike. Every parser accepts the text a tool printed (real captures
live in tests/fixtures/gpu-tools/) and returns a list of partially filled :class:`Gpu` records;
:func:`merge` combines the sources by GPU index and :func:`check` turns an :class:`Expectation`
into one-line failure messages of the form
``host1: GPU 0: arch gfx90a, expected gfx942 (likely cause: ...)``.
"""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import asdict, dataclass, field, fields
from typing import Any

# PCI device ids seen in the captures (and AMD's pci.ids entries for the same boards).
DEVICE_IDS: dict[str, str] = {
    "0x74a1": "AMD Instinct MI300X",
    "0x74b5": "AMD Instinct MI300X VF",
    "0x74a0": "AMD Instinct MI300A",
    "0x74a2": "AMD Instinct MI308X",
    "0x740f": "AMD Instinct MI210",
    "0x7408": "AMD Instinct MI250X",
    "0x740c": "AMD Instinct MI250X / MI250",
}
VF_DEVICE_IDS = frozenset({"0x74b5"})

# Product family -> LLVM target, used only when no tool reported the arch directly.
_PRODUCT_ARCH: tuple[tuple[str, str], ...] = (
    (r"MI30[08][XA]?", "gfx942"),
    (r"MI2[15]0X?", "gfx90a"),
    (r"MI100", "gfx908"),
)

# Compute units per logical device of an MI300X for each compute partition mode.
MI300X_CU_PARTITION: dict[int, str] = {304: "SPX", 152: "DPX", 76: "QPX", 38: "CPX"}

PARTITIONS = ("SPX", "DPX", "TPX", "QPX", "CPX")
_GIB = 1024**3
_NA = {"", "N/A", "NA", "NONE"}


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
    """What a healthy node looks like; a ``None`` field switches that check off."""

    arch: str | None = "gfx942"
    count: int | None = 8
    product: str | None = "MI300X"
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
    suffix = " VF" if re.search(r"\bVF\b", text) else ""
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
        and "MI300X" in gpu.product.upper()
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
    stripped = text.strip()
    if stripped.startswith(("{", "[")):
        return parse_amd_smi_json(stripped)
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
    elif key == "COMPUTE_PARTITION":
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
        ids = re.match(r"^\|\s*(\d+)\s+\S+\s+\S+\s+(\w+)/(\w+)\s*\|", second)
        gpu = Gpu(index=int(ids.group(1)) if ids else len(gpus), product=head.group(2), sources=["amd-smi"])
        if ids:
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


def parse_amd_smi_json(text: str) -> list[Gpu]:
    """``amd-smi <list|static|metric> --json``: a list of per-GPU objects or ``{"gpu_data": [...]}``."""
    data = json.loads(text)
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
        gpu.compute_units = int(cus) if isinstance(cus, int) else None
        vram = _dig(item, "vram", "size")
        if vram is None:
            vram = _dig(item, "mem_usage", "total_vram")
        gpu.vram_bytes = _json_size(vram) if vram is not None else None
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


_CAUSE_ARCH = (
    "{product} is not an MI300X; software built only for gfx942 code objects fails here with "
    "hipErrorNoBinaryForGPU"
)
_MAX_LINES_PER_CHECK = 2


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
            else "a GPU is missing from the bus or failed to initialise; check `dmesg | grep amdgpu` "
            "and `amd-smi list`, or set gpu_verify_expected_count"
        )
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
        out.append(
            (
                "arch",
                f"arch {gpu.arch or 'unknown'}, expected {expect.arch} (likely cause: "
                + _CAUSE_ARCH.format(product=product)
                + ")",
            )
        )
    # a wrong arch already names the product, so the product check only speaks for a right arch
    if (
        not out
        and expect.product is not None
        and not (
            gpu.product and re.search(rf"\b{re.escape(expect.product)}\b", gpu.product, flags=re.IGNORECASE)
        )
    ):
        out.append(
            (
                "product",
                f"product {gpu.product or 'unknown'}, expected {expect.product} (likely cause: "
                "a different Instinct model in this node; set gpu_verify_expected_product if intended)",
            )
        )
    if not expect.allow_vf and gpu.is_vf:
        out.append(
            (
                "vf",
                f"virtual function ({product}, device {gpu.device_id or 'unknown'}), VF not allowed "
                "(likely cause: a VM guest with an SR-IOV GPU; set gpu_verify_allow_vf: true to accept)",
            )
        )
    if expect.partition is not None and gpu.compute_partition not in {None, expect.partition}:
        out.append(
            (
                "partition",
                f"partition {gpu.compute_partition}, expected {expect.partition} (likely cause: "
                f"compute partitioning was changed; run `amd-smi set --compute-partition {expect.partition}` "
                "or reload amdgpu, which reverts to SPX)",
            )
        )
    if expect.min_vram_gib is not None and gpu.vram_gib is not None and gpu.vram_gib < expect.min_vram_gib:
        out.append(
            (
                "vram",
                f"VRAM {gpu.vram_gib} GiB, expected at least {expect.min_vram_gib} GiB (likely cause: "
                "a memory or compute partition mode, or a different model)",
            )
        )
    return out


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
