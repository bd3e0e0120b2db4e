"""Headless Chromium for the tests that look at a page as a person would (Debian's ``chromium``).

``render`` loads a local file with networking and background services off, and returns the DOM
after layout and a PNG screenshot; ``png_pixels`` decodes a PNG with the standard library only.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
import tempfile
import zlib
from pathlib import Path

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--force-device-scale-factor=1"]


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        raise RuntimeError("Debian's chromium package is needed: apt-get install -y chromium (.ci/run does)")
    return found


def render(page: Path, screenshot: Path, size: tuple[int, int] = (1280, 900)) -> str:
    """The DOM of ``page`` once loaded (``--dump-dom``), after writing its screenshot."""
    url = page.resolve().as_uri()
    with tempfile.TemporaryDirectory() as profile:
        common = [chromium(), *FLAGS, f"--user-data-dir={profile}", f"--window-size={size[0]},{size[1]}"]
        subprocess.run([*common, f"--screenshot={screenshot}", url], check=True, capture_output=True, timeout=120)
        dom = subprocess.run([*common, "--dump-dom", url], check=True, capture_output=True, text=True, timeout=120)
    return dom.stdout


def png_pixels(data: bytes) -> tuple[int, int, list[bytes]]:
    """``(width, height, rows)`` of an 8-bit RGB or RGBA PNG; each row is its unfiltered bytes."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, width, height, channels = 8, b"", 0, 0, 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and colour in (2, 6), (depth, colour)
            channels = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw, stride, rows, prev = zlib.decompress(idat), width * channels, [], bytearray(width * channels)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for x in range(stride):
            left = line[x - channels] if x >= channels else 0
            up, corner = prev[x], prev[x - channels] if x >= channels else 0
            if kind == 1:
                line[x] = (line[x] + left) & 0xFF
            elif kind == 2:
                line[x] = (line[x] + up) & 0xFF
            elif kind == 3:
                line[x] = (line[x] + (left + up) // 2) & 0xFF
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                line[x] = (line[x] + (left if pa <= pb and pa <= pc else up if pb <= pc else corner)) & 0xFF
        rows.append(bytes(line))
        prev = line
    return width, height, rows
