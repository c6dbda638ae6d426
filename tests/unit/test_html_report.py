"""The HTML report (#42): one self-contained page beside a check's JSON (no network, no script),
every node-written text escaped, rendered in a real headless browser (Debian's chromium): a
screenshot the test reads back shows the page and the odd node's marked cell on its first
screen, at 256 nodes."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from tests.unit.test_folded_reports import VBIOS, capture
from trainfleet.compare import Finding, Report
from trainfleet.html_report import heatmap, page

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ODD_RED = (0xD5, 0x00, 0x00)  # td.odd's background


def _paeth(left: int, up: int, corner: int) -> int:
    p = left + up - corner
    pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
    return left if pa <= pb and pa <= pc else up if pb <= pc else corner


def pixels(png: bytes) -> tuple[int, int, list[bytes]]:
    """A PNG's width, height and rows of RGB bytes (8-bit RGB or RGBA, not interlaced: what
    chromium writes), unfiltered as the PNG specification says."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    at, idat, header = 8, b"", b""
    while at < len(png):
        (length,) = struct.unpack(">I", png[at : at + 4])
        kind, data = png[at + 4 : at + 8], png[at + 8 : at + 8 + length]
        header = data if kind == b"IHDR" else header
        idat += data if kind == b"IDAT" else b""
        at += 12 + length
    width, height, depth, color = struct.unpack(">IIBB", header[:10])
    assert depth == 8 and color in (2, 6), (depth, color)
    bpp = 3 if color == 2 else 4
    raw, stride = zlib.decompress(idat), width * bpp
    rows, previous = [], bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1 : start + 1 + stride])
        for i in range(stride) if kind else ():
            left = line[i - bpp] if i >= bpp else 0
            corner = previous[i - bpp] if i >= bpp else 0
            add = (
                0,
                left,
                previous[i],
                (left + previous[i]) // 2,
                _paeth(left, previous[i], corner),
            )
            line[i] = (line[i] + add[kind]) & 255
        rows.append(b"".join(bytes(line[i : i + 3]) for i in range(0, stride, bpp)))
        previous = line
    return width, height, rows


def screenshot(page_file: Path, out: Path) -> bytes:
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("Debian's chromium is not installed (make host-deps installs it)")
        pytest.skip("no chromium here")
    subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         f"--screenshot={out}", "--window-size=1000,700", page_file.as_uri()],
        capture_output=True, timeout=120, check=True,
        env={**os.environ, "HOME": str(out.parent)},  # chromium's profile: the test's folder
    )  # fmt: skip
    return out.read_bytes()


def test_diagnose_writes_a_page_a_browser_renders_with_the_odd_node_on_its_first_screen(
    tmp_path,
):
    root = capture(tmp_path, 256, {"gpu131": VBIOS})
    html = tmp_path / "diagnose.html"
    run = subprocess.run(
        [sys.executable, "-m", "trainfleet", "diagnose", str(root), "--html", str(html)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert run.returncode == 1, run.stderr  # a finding
    text = html.read_text()
    assert "<script" not in text and "http://" not in text and "https://" not in text
    assert "256 nodes, 1 odd: gpu131" in text
    width, height, rows = pixels(screenshot(html, tmp_path / "shot.png"))
    assert (width, height) == (1000, 700)
    red = [
        (x, y)
        for y, row in enumerate(rows)
        for x in range(width)
        if row[x * 3 : x * 3 + 3] == bytes(ODD_RED)
    ]
    assert red, "no odd cell on the first screen"
    distinct = {row[x * 3 : x * 3 + 3] for row in rows[::50] for x in range(0, width, 50)}
    assert len(distinct) > 3  # text, the green cells, the red one: a rendered page, not blank


def test_node_written_text_is_escaped_and_the_heatmap_shades_the_slow_pair():
    evil = '<img src=x onerror=alert(1)>"&'
    report = Report(
        "c",
        ["n1", "n2"],
        {"n1": {"p": evil}, "n2": {"p": "ok"}},
        [Finding("n1", "p", "health", evil)],
    )
    html = page(report, "t")
    assert evil not in html and "&lt;img src=x onerror=alert(1)&gt;&quot;&amp;" in html
    cells = heatmap(["n1", "n2", "n3"], {("n1", "n2"): 1.0, ("n1", "n3"): 0.125})
    assert "rgb(255,255,255)" in cells and "rgb(255,31,31)" in cells and "#eee" in cells


def test_a_bad_html_path_is_a_usage_error_before_the_capture_is_read(tmp_path):
    run = subprocess.run(
        [sys.executable, "-m", "trainfleet", "diagnose", str(tmp_path / "none"), "--html",
         str(tmp_path / "nowhere" / "x.html")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert run.returncode == 64 and "--html:" in run.stderr
