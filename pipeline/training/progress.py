"""Rank-0 progress: one live line on a terminal, periodic plain lines otherwise."""

from __future__ import annotations

import sys
from typing import TextIO


def format_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024:
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024
    return f"{n:.1f}TB"


def format_progress(step: int, total: int, epoch: int, samples_per_s: float, loss: float, lr: float,
                    density: float, bytes_sent: int, bytes_dense: int) -> str:
    ratio = bytes_dense / bytes_sent if bytes_sent else float("nan")
    return (f"step {step}/{total} epoch {epoch} | {samples_per_s:,.0f} samples/s | loss {loss:.4f} | "
            f"lr {lr:.2e} | density {density:.4g} | sent {format_bytes(bytes_sent)}/step "
            f"({ratio:.0f}x fewer than dense)")


class ProgressLine:
    """Rewrites one line in place on a TTY; prints one line per update when piped (logs, tests)."""

    def __init__(self, stream: TextIO = sys.stdout) -> None:
        self.stream = stream
        self.live = stream.isatty()

    def update(self, text: str) -> None:
        if self.live:
            self.stream.write("\r\x1b[2K" + text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def finish(self, text: str = "") -> None:
        if self.live:
            self.stream.write("\n")
        if text:
            self.stream.write(text + "\n")
        self.stream.flush()
