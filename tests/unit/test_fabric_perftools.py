"""The parsers of ``all_reduce_perf`` (nccl-tests / rccl-tests) and ``ib_write_bw`` (perftest) over real
captures (tests/fixtures/nccl-tests, tests/fixtures/perftest; provenance in each PROVENANCE.md), and the one
line a bad output becomes. The bad outputs are the real captures cut or edited as each test says."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.fabric.perftools import ToolOutputError, all_reduce_perf, ib_write_bw, tool_line

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
NCCL_2X8 = (FIXTURES / "nccl-tests" / "nccl_all_reduce_perf_2x8_h100.txt").read_text()
RCCL_1X8 = (FIXTURES / "nccl-tests" / "rccl_all_reduce_perf_1x8_mi300x.txt").read_text()
RCCL_2X8 = (FIXTURES / "nccl-tests" / "rccl_all_reduce_perf_2x8_mi300x.txt").read_text()
GIB = 1 << 30


def _bus(algbw: float, ranks: int) -> float:
    return algbw * 2 * (ranks - 1) / ranks  # nccl-tests doc/PERFORMANCE.md, AllReduce


def test_nccl_tests_two_nodes_of_8_h100() -> None:
    parsed = all_reduce_perf(NCCL_2X8)
    assert (len(parsed.rows), parsed.ranks, parsed.version, parsed.avg_busbw_gbs) == (
        31,
        16,
        "nccl-tests",
        70.742,
    )
    row = parsed.row_at(GIB)
    assert row is not None
    assert (row.time_us, row.algbw_gbs, row.busbw_gbs, row.inplace_busbw_gbs) == (
        6759.0,
        158.86,
        297.86,
        298.82,
    )
    assert parsed.largest.size_bytes == 8 * GIB
    # the printed busbw is algbw x 2(n-1)/n (to the table's two decimals) from 1 MiB up
    for r in parsed.rows[17:]:
        assert r.busbw_gbs == pytest.approx(_bus(r.algbw_gbs, 16), abs=0.02)


def test_rccl_tests_one_node_of_8_mi300x() -> None:
    parsed = all_reduce_perf(RCCL_1X8)
    assert (parsed.ranks, parsed.version, parsed.avg_busbw_gbs) == (
        8,
        "rccl-tests: Version develop:a7809b3",
        110.464,
    )
    row = parsed.row_at(GIB)
    assert row is not None and (row.algbw_gbs, row.busbw_gbs) == (179.24, 313.66)
    assert row.busbw_gbs == pytest.approx(_bus(row.algbw_gbs, 8), abs=0.02)


def test_rccl_tests_two_nodes_of_8_mi300x_with_its_version_lines() -> None:
    parsed = all_reduce_perf(RCCL_2X8)
    assert (parsed.ranks, len(parsed.rows)) == (16, 32)
    assert parsed.largest.size_bytes == 16 * GIB and parsed.largest.busbw_gbs == 357.46
    row = parsed.row_at(GIB)
    assert row is not None and (row.algbw_gbs, row.busbw_gbs) == (181.74, 340.75)


def _cut_after(text: str, size: str) -> str:
    lines = text.splitlines()
    end = next(i for i, line in enumerate(lines) if line.split()[:1] == [size])
    return "\n".join(lines[: end + 1]) + "\n"


def test_a_table_cut_short_is_truncated() -> None:
    """The capture up to its 64 MiB row (a test killed or hung mid-sweep)."""
    with pytest.raises(ToolOutputError) as err:
        all_reduce_perf(_cut_after(RCCL_1X8, "67108864"))
    assert str(err.value) == "truncated table: last size 67108864 bytes of 8589934592 (maxBytes)"


def test_a_full_table_without_its_average_line_is_truncated() -> None:
    """The capture up to its last row, the ``# Avg bus bandwidth`` line cut."""
    with pytest.raises(
        ToolOutputError, match=r"^truncated table: no '# Avg bus bandwidth' line after 8589934592"
    ):
        all_reduce_perf(_cut_after(RCCL_1X8, "8589934592"))


def test_a_test_that_printed_no_table_is_named() -> None:
    """The capture up to its device list (a test that hung in its first collective)."""
    head = RCCL_1X8.split("#                                                              out-of-place")[0]
    with pytest.raises(ToolOutputError, match=r"^no result table"):
        all_reduce_perf(head)


def test_nan_bandwidth_is_bad() -> None:
    """The capture with its 1 MiB row's out-of-place busbw replaced by ``nan``."""
    row = "     1048576        262144     float     sum      -1    28.39   36.94   64.64"
    assert row in RCCL_1X8
    edited = RCCL_1X8.replace(row, row.replace("64.64", "  nan"))
    with pytest.raises(ToolOutputError) as err:
        all_reduce_perf(edited)
    assert tool_line("host3", "all_reduce_perf", str(err.value)) == (
        "host3: all_reduce_perf: busbw is nan at 1048576 bytes"
    )


def test_ib_write_bw_in_gbits_and_in_mbytes() -> None:
    roce = ib_write_bw((FIXTURES / "perftest" / "ib_write_bw_bnxt_roce_gbits.txt").read_text())
    assert (roce.size_bytes, roce.iterations, roce.average, roce.unit) == (65536, 4159603, 363.47, "Gb/sec")
    assert (roce.device, roce.link_type, roce.average_gbits, roce.peak) == (
        "bnxt_re0",
        "Ethernet",
        363.47,
        0.0,
    )
    mlx = ib_write_bw((FIXTURES / "perftest" / "ib_write_bw_mlx5_roce_mbytes.txt").read_text())
    # the CPU frequency warning between header and result is skipped
    assert (mlx.peak, mlx.average, mlx.unit, mlx.average_gbits) == (11025.44, 11024.71, "MB/sec", None)
    post = ib_write_bw((FIXTURES / "perftest" / "ib_write_bw_post_list_gbits.txt").read_text())
    assert (post.size_bytes, post.average, post.msg_rate_mpps, post.device) == (8, 0.48, 7.498617, "ib0")


def test_ib_write_bw_without_a_result_or_with_a_negative_one_is_bad() -> None:
    text = (FIXTURES / "perftest" / "ib_write_bw_bnxt_roce_gbits.txt").read_text()
    with pytest.raises(ToolOutputError, match=r"^truncated: header but no result row$"):
        ib_write_bw(text.split(" 65536      4159603")[0])  # cut before the result row
    with pytest.raises(ToolOutputError, match=r"^no result"):
        ib_write_bw(text.split(" #bytes")[0])  # cut before the header: the client never connected
    with pytest.raises(ToolOutputError, match=r"^BW average is negative \(-363.47\) at 65536 bytes$"):
        ib_write_bw(text.replace("   363.47", "  -363.47"))
