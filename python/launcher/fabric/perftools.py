"""Parsers of what the fabric benchmarks print: ``all_reduce_perf`` (nccl-tests / rccl-tests), ``ib_write_bw``
(perftest).

Both are tested on real captures (tests/fixtures/nccl-tests, tests/fixtures/perftest, provenance in each
folder's PROVENANCE.md). Output that cannot be trusted is a :class:`ToolOutputError` whose text says what is
wrong in one line (a truncated table, NaN or negative bandwidth, no result); :func:`tool_line` puts the node
and the tool in front of it.

``all_reduce_perf`` prints one row per size: ``size count type redop root`` then, out of place and in place,
``time algbw busbw #wrong`` (time in us, bandwidths in GB/s, 1 GB = 1e9 bytes), and ends with ``# Avg bus
bandwidth : X``. Bus bandwidth is nccl-tests' definition (doc/PERFORMANCE.md of NVIDIA/nccl-tests): for
all-reduce ``busbw = algbw * 2(n-1)/n`` with ``algbw = S/t``; the table is read as printed, not recomputed.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass


class ToolOutputError(ValueError):
    """A benchmark's output that cannot be trusted; its text is one line."""


def tool_line(host: str, tool: str, error: str) -> str:
    """Return the one line that names the node and the tool of a bad output."""
    return f"{host}: {tool}: {error}"


@dataclass(frozen=True)
class SizeRow:
    """One size of an ``all_reduce_perf`` table (out of place and in place)."""

    size_bytes: int
    count: int
    dtype: str
    time_us: float
    algbw_gbs: float
    busbw_gbs: float
    wrong: str
    inplace_time_us: float
    inplace_algbw_gbs: float
    inplace_busbw_gbs: float
    inplace_wrong: str


@dataclass(frozen=True)
class AllReducePerf:
    """A parsed ``all_reduce_perf`` run: its rows, the average bus bandwidth line, ranks, versions."""

    rows: tuple[SizeRow, ...]
    avg_busbw_gbs: float
    ranks: int
    version: str  # "nccl-tests" or "rccl-tests: Version ..." as printed

    @property
    def largest(self) -> SizeRow:
        """Return the row of the largest size."""
        return self.rows[-1]

    def row_at(self, size_bytes: int) -> SizeRow | None:
        """Return the row of exactly ``size_bytes`` (None: not in the table)."""
        return next((r for r in self.rows if r.size_bytes == size_bytes), None)


_HEADER_RE = re.compile(r"^#\s+size\s+count\s+type\s+redop\s+root\s+time\s+algbw\s+busbw")
_RANK_RE = re.compile(r"^#\s+Rank\s+\d+\s")
_AVG_RE = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*(\S+)")
_MAX_BYTES_RE = re.compile(r"maxBytes\s+(\d+)")
_NUMBER = r"(-?nan|-?inf|-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)"
_ROW_RE = re.compile(
    r"^\s*(\d+)\s+(\d+)\s+(\w+)\s+(\w+)\s+(-?\d+)\s+"
    + r"\s+".join([_NUMBER] * 3)
    + r"\s+(\S+)\s+"
    + r"\s+".join([_NUMBER] * 3)
    + r"\s+(\S+)\s*$",
    re.IGNORECASE,
)


def _finite(value: str, what: str, size: str) -> float:
    number = float(value)
    if math.isnan(number) or math.isinf(number):
        raise ToolOutputError(f"{what} is {value} at {size} bytes")
    if number < 0:
        raise ToolOutputError(f"{what} is negative ({value}) at {size} bytes")
    return number


def all_reduce_perf(text: str) -> AllReducePerf:
    """Parse ``all_reduce_perf``'s output (nccl-tests or rccl-tests; ``-g N`` or one process per GPU).

    Raises :class:`ToolOutputError` when there is no table, a row has NaN/inf/negative figures, or the table
    stops before the ``maxBytes`` its first line announced or before its ``# Avg bus bandwidth`` line (a test
    that hung or was killed).
    """
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if _HEADER_RE.match(line)), None)
    if start is None:
        raise ToolOutputError("no result table (no '#  size  count  type ...' header)")
    ranks = sum(1 for line in lines[:start] if _RANK_RE.match(line))
    version = next((line.strip() for line in lines[:start] if line.startswith("rccl-tests")), "nccl-tests")
    max_bytes = next((int(m.group(1)) for line in lines[:start] if (m := _MAX_BYTES_RE.search(line))), None)
    rows: list[SizeRow] = []
    avg: float | None = None
    for line in lines[start + 1 :]:
        if match := _AVG_RE.match(line):
            avg = _finite(match.group(1), "average bus bandwidth", "all")
            break
        match = _ROW_RE.match(line)
        if not match:
            continue
        g = match.groups()
        size = g[0]
        rows.append(
            SizeRow(
                size_bytes=int(size),
                count=int(g[1]),
                dtype=g[2],
                time_us=_finite(g[5], "time", size),
                algbw_gbs=_finite(g[6], "algbw", size),
                busbw_gbs=_finite(g[7], "busbw", size),
                wrong=g[8],
                inplace_time_us=_finite(g[9], "in-place time", size),
                inplace_algbw_gbs=_finite(g[10], "in-place algbw", size),
                inplace_busbw_gbs=_finite(g[11], "in-place busbw", size),
                inplace_wrong=g[12],
            )
        )
    if not rows:
        raise ToolOutputError("result table has no rows")
    last = rows[-1].size_bytes
    if max_bytes is not None and last < max_bytes:
        raise ToolOutputError(f"truncated table: last size {last} bytes of {max_bytes} (maxBytes)")
    if avg is None:
        raise ToolOutputError(f"truncated table: no '# Avg bus bandwidth' line after {last} bytes")
    return AllReducePerf(tuple(rows), avg, ranks, version)


@dataclass(frozen=True)
class IbWriteBw:
    """A parsed ``ib_write_bw`` result: message size, iterations, peak and average bandwidth in the unit it
    printed (``Gb/sec`` with ``--report_gbits``, else ``MB/sec``), message rate, device, link type."""

    size_bytes: int
    iterations: int
    peak: float
    average: float
    unit: str
    msg_rate_mpps: float
    device: str
    link_type: str

    @property
    def average_gbits(self) -> float | None:
        """Return the average in Gb/s when printed in Gb/sec (None: printed in MB/sec)."""
        return self.average if self.unit == "Gb/sec" else None


_BW_HEADER_RE = re.compile(r"#bytes\s+#iterations\s+BW peak\[(\w+/sec)\]\s+BW average\[(\w+/sec)\]")
_BW_ROW_RE = re.compile(r"^\s*(\d+)\s+(\d+)\s+" + r"\s+".join([_NUMBER] * 3) + r"\s*$", re.IGNORECASE)
_DEVICE_RE = re.compile(r"Device\s*:\s*(\S+)")
_LINK_RE = re.compile(r"Link type\s*:\s*(\S+)")


def ib_write_bw(text: str) -> IbWriteBw:
    """Parse ``ib_write_bw``'s output (either side; one message size).

    Lines between the header and the result (``Conflicting CPU frequency values detected ...``) are skipped.
    Raises :class:`ToolOutputError` when there is no header or no result row, or the bandwidth is
    NaN/inf/negative.
    """
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if _BW_HEADER_RE.search(line)), None)
    if start is None:
        raise ToolOutputError("no result (no '#bytes #iterations BW peak' header)")
    header = _BW_HEADER_RE.search(lines[start])
    assert header is not None
    device = next((m.group(1) for line in lines[:start] if (m := _DEVICE_RE.search(line))), "")
    link = next((m.group(1) for line in lines[:start] if (m := _LINK_RE.search(line))), "")
    for line in lines[start + 1 :]:
        match = _BW_ROW_RE.match(line)
        if not match:
            continue
        size = match.group(1)
        return IbWriteBw(
            size_bytes=int(size),
            iterations=int(match.group(2)),
            peak=_finite(match.group(3), "BW peak", size),
            average=_finite(match.group(4), "BW average", size),
            unit=header.group(2),
            msg_rate_mpps=_finite(match.group(5), "MsgRate", size),
            device=device,
            link_type=link,
        )
    raise ToolOutputError("truncated: header but no result row")
