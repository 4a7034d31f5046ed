"""A process's identity that a recycled pid or a clock adjustment cannot fake: its pid and its start.

psutil's ``create_time()`` adds the boot time read from ``/proc/stat`` at each call, and that moves
by a second when the system clock is adjusted (NTP), so the same process can read two create times;
a watcher that compared them took a process it had seen for another and let it live. The kernel's
own start time, in clock ticks since boot (``/proc/PID/stat``), never changes. Standard library only.
"""

from __future__ import annotations


def _stat_fields(pid: int) -> list[bytes] | None:
    """The fields of ``/proc/PID/stat`` after the command name (which may hold spaces), from the
    state (field 3) on; None if the process is gone (or unreadable)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _start_of(fields: list[bytes] | None) -> int | None:
    try:
        return int(fields[19]) if fields is not None else None  # field 22 of the line
    except (IndexError, ValueError):
        return None


def start_ticks(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot; None if it is gone (or unreadable)."""
    return _start_of(_stat_fields(pid))


def is_running(pid: int, started: int) -> bool:
    """Whether the process that started at ``started`` (:func:`start_ticks`) as ``pid`` still runs: not
    ended, not a zombie waiting for its parent to collect it, and not another process on a reused pid."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] not in (b"Z", b"X") and _start_of(fields) == started
