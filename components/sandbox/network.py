"""Counting a command's attempts to reach a network from its network namespace's own
counters: a small shell runs the command, then writes /proc/net/snmp and snmp6 to a pipe
(`NET_COUNTING_SHELL`); `network_attempts` sums the counters that move only when something
sends a packet or opens a connection, whatever program or spelling made it."""

from __future__ import annotations

import contextlib
import os
import re

# Runs the command with the namespace's counter pipe closed (stdin is /dev/null for it),
# then writes the namespace's IP counters to that pipe (our stdin, opened for writing).
NET_COUNTING_SHELL = (
    "/bin/sh",
    "-c",
    '"$@" </dev/null; s=$?; cat /proc/net/snmp /proc/net/snmp6 >&0 2>/dev/null; exit $s',
    "sh",
)
# (table, counter) pairs that move only when something tries to reach a network.
_ATTEMPT_COUNTERS = frozenset({
    ("Ip", "OutRequests"), ("Ip", "OutNoRoutes"), ("Tcp", "ActiveOpens"),
    ("Udp", "OutDatagrams"), ("UdpLite", "OutDatagrams"), ("Ip6", "OutRequests"),
    ("Ip6", "OutNoRoutes"), ("Udp6", "OutDatagrams"), ("UdpLite6", "OutDatagrams"),
})  # fmt: skip
_COUNTER_BYTES_MAX = 1 << 16


def read_counters(fd: int | None) -> str:
    """What the counting shell wrote (every writer is dead by now; never blocks)."""
    if fd is None:
        return ""
    data = bytearray()
    try:
        os.set_blocking(fd, False)
        with contextlib.suppress(BlockingIOError, OSError):
            while len(data) < _COUNTER_BYTES_MAX and (chunk := os.read(fd, 65536)):
                data += chunk
    finally:
        os.close(fd)
    return data.decode("ascii", errors="replace")


def network_attempts(counters: str) -> int:
    """Packets sent and connections opened, summed over the attempt counters of every
    /proc/net/snmp (header line + value line per table) and snmp6 ("Ip6OutRequests 3")
    block in `counters`. Extra blocks written by the command itself can only add."""
    total = 0
    lines = counters.splitlines()
    for head, values in zip(lines, lines[1:], strict=False):
        names, numbers = head.split(), values.split()
        if len(names) < 2 or not names[0].endswith(":") or names[0] != numbers[0]:
            continue
        table = names[0][:-1]
        for name, number in zip(names[1:], numbers[1:], strict=False):
            if (table, name) in _ATTEMPT_COUNTERS and number.isdigit():
                total += int(number)
    for line in lines:
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            m = re.match(r"^(Ip6|Udp6|UdpLite6)(\w+)$", parts[0])
            if m and (m.group(1), m.group(2)) in _ATTEMPT_COUNTERS:
                total += int(parts[1])
    return total
