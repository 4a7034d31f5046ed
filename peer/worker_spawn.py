"""Training workers started as fresh interpreters without multiprocessing's resource tracker.

multiprocessing's ``spawn`` start runs a resource tracker process beside the parent (one more process
per peer) to unlink named semaphores and shared memory a killed process leaves. A worker's channels
are a pipe and torch tensors shared by file descriptor, neither of which it tracks, so
:class:`WorkerProcess` starts the interpreter the same way, less the tracker.
"""

from __future__ import annotations

import io
import multiprocessing.context
import multiprocessing.popen_spawn_posix
import os
from multiprocessing import reduction, spawn, util


class _PopenWithoutTracker(multiprocessing.popen_spawn_posix.Popen):
    def _launch(self, process_obj) -> None:
        preparation = spawn.get_preparation_data(process_obj._name)
        payload = io.BytesIO()
        multiprocessing.context.set_spawning_popen(self)  # shared tensors' fds go into self._fds
        try:
            reduction.dump(preparation, payload)
            reduction.dump(process_obj, payload)
        finally:
            multiprocessing.context.set_spawning_popen(None)
        parent_r, child_w = os.pipe()
        child_r, parent_w = os.pipe()
        try:
            command = spawn.get_command_line(pipe_handle=child_r)
            self._fds.extend([child_r, child_w])
            self.pid = util.spawnv_passfds(spawn.get_executable(), command, self._fds)
            self.sentinel = parent_r
            with open(parent_w, "wb", closefd=False) as child_input:
                child_input.write(payload.getbuffer())
        finally:
            self.finalizer = util.Finalize(self, util.close_fds, (parent_r, parent_w))
            os.close(child_r)
            os.close(child_w)


class WorkerProcess(multiprocessing.context.SpawnProcess):
    """A ``spawn``-started process (a fresh interpreter: safe with CUDA) with no resource tracker."""

    @staticmethod
    def _Popen(process_obj):
        return _PopenWithoutTracker(process_obj)
