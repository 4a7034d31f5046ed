"""One lock for torch's global random generator, shared by every thread of a process.

Data augmentation (torchvision transforms), dropout and ``torch.random.fork_rng`` all use the
process-wide generator. A computation that must replay an exact random sequence — a spot audit
re-drawing a peer's augmentation after ``torch.manual_seed`` — gets a different sequence if another
thread seeds, draws from or restores that generator meanwhile (the aggregator evaluates checkpoints
for its dashboard in another thread). Such computations hold :data:`TORCH_RNG_LOCK` for their whole
duration, and so does :meth:`supernet.workload.Workload.build` (weight initialisation): a checkpoint
written while an audit replayed once revoked an honest receipt (sketch distance 1.66 instead of ~5e-3).
"""

from __future__ import annotations

import threading

TORCH_RNG_LOCK = threading.RLock()
