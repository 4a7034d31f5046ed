"""A process's identity that a recycled pid or a clock adjustment cannot fake: its pid and its start.

psutil's ``create_time()`` adds the boot time read from ``/proc/stat`` at each call, and that moves
by a second when the system clock is adjusted (NTP), so the same process can read two create times;
a watcher that compared them took a process it had seen for another and let it live. The kernel's
own start time, in clock ticks since boot (``/proc/PID/stat``), never changes. Standard library only.
"""

from __future__ import annotations


def start_ticks(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot; None if it is gone (or unreadable)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()  # after the command name, which may hold spaces
    except (OSError, IndexError):
        return None
    try:
        return int(fields[19])  # field 22 of the line; fields[0] is field 3 (the state)
    except (IndexError, ValueError):
        return None


def is_running(pid: int, started: int) -> bool:
    """Whether the process that started at ``started`` (:func:`start_ticks`) as ``pid`` still runs: not
    ended, not a zombie waiting for its parent to collect it, and not another process on a reused pid."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        return fields[0] not in (b"Z", b"X") and int(fields[19]) == started
    except (OSError, IndexError, ValueError):
        return False
