"""Capping text to a byte budget, head and tail kept with a visible truncation line: what
a command printed (`OutputBuffer`) and what an observation may hold (`cap_text`)."""

from __future__ import annotations


class OutputBuffer:
    """Keeps the first and last bytes of a stream within a byte budget, counting the rest."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.head_limit = max_bytes // 2
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            # Trim lazily (at 2x) so a stream of small chunks is not quadratic.
            if len(self.tail) > 2 * self.max_bytes:
                del self.tail[: len(self.tail) - self.max_bytes]

    def getvalue(self) -> tuple[bytes, bool]:
        """(kept bytes with a truncation line where bytes were dropped, truncated?)"""
        if self.total <= self.max_bytes:
            return bytes(self.head + self.tail), False
        # Reserve room for the marker so the result stays within max_bytes.
        marker_len = len(_marker(self.total))
        tail_keep = max(0, self.max_bytes - len(self.head) - marker_len)
        tail = self.tail[len(self.tail) - tail_keep :] if tail_keep else b""
        omitted = self.total - len(self.head) - len(tail)
        return bytes(self.head) + _marker(omitted) + bytes(tail), True


def _marker(omitted: int) -> bytes:
    return f"\n[... output truncated: {omitted} bytes omitted ...]\n".encode()


def encodable(text: str) -> str:
    """`text` with every lone surrogate (a non-UTF-8 file name) as "?": what an
    observation must be for a tokenizer (or any UTF-8 writer) to take it."""
    return text.encode("utf-8", errors="replace").decode("utf-8")


def cap_text(text: str, max_bytes: int) -> tuple[str, bool]:
    """Cap `text` at max_bytes of UTF-8 (head and tail kept, marker in between). A lone
    surrogate (a non-UTF-8 file name) becomes "?": the text must encode for a tokenizer."""
    data = text.encode("utf-8", errors="replace")
    if len(data) <= max_bytes:
        return data.decode("utf-8"), False
    buf = OutputBuffer(max_bytes)
    buf.feed(data)
    kept, _ = buf.getvalue()
    return kept.decode("utf-8", errors="replace"), True
