"""The supernet training recipe, in pieces the swarm can reuse, and one single-process loop.

One step (:func:`supernet.training.loop.train` shows them in order)::

    phase   = phase_at(step, cfg)                      # progressive shrinking or single-stage sandwich
    maybe_sort_channels(net, step, cfg, optimizer)     # when a width phase starts (deterministic)
    configs = step_configs(net, step, cfg)             # sandwich rule, from (seed, step) only
    stats   = accumulate_gradients(net, x, y, configs, cfg)   # K sub-networks, grads summed, NO step
    ...                                                # (the swarm averages gradients here)
    optimizer_step(net, optimizer, step, cfg)          # lr_at(step), optional clipping, step

Modules (import each name from its module; this package exports nothing itself):

* :mod:`~supernet.training.config` — :class:`TrainConfig`, every hyper-parameter in one dataclass;
* :mod:`~supernet.training.schedule` — phases, and the sub-networks each step (or cohort) trains;
* :mod:`~supernet.training.build` — the supernet a config describes, with seeded initial weights;
* :mod:`~supernet.training.optimizer` — the optimizer, the learning-rate schedule, one step;
* :mod:`~supernet.training.gradients` — the sandwich loss and gradient accumulation, and its FLOPs;
* :mod:`~supernet.training.batches` — training batches, collated and augmented reproducibly;
* :mod:`~supernet.training.evaluation` — BN recalibration and the metric of chosen sub-networks;
* :mod:`~supernet.training.loop` — :func:`train`, the single-process loop.

**Schedules** (``TrainConfig.schedule``):

* ``"sandwich"`` — single-stage (BigNAS-style): every step trains the largest, the smallest and
  ``K - 2`` random sub-networks of the whole space, with in-place distillation from the largest.
* ``"progressive"`` — once-for-all progressive shrinking: ``full`` (the largest network only), then
  ``kernel`` (elastic kernel), then ``depth`` (depths added from the deepest down, one stage per
  extra depth), then ``width`` (expand ratios added from the widest down, one stage per ratio).
  ``phase_fractions`` gives each phase's share of ``total_steps`` (split evenly among its stages).
  When a width stage starts, every block's middle channels are sorted by importance (L1 norm of the
  projection weights), within bands that keep the widths of earlier stages nested. Every stage after
  ``full`` samples by the sandwich rule inside the phase's space.

**Loss**: the largest sub-network is trained on the labels; every other sub-network on
``student_label_weight × task loss + distill_weight × KD``, where KD is the cross-entropy against the
largest sub-network's detached soft predictions on the same batch (in-place distillation; temperature
``distill_temperature``). Gradients of the K sub-networks are summed (the learning rate is not divided
by K, as in once-for-all). **Optimizer**: SGD (Nesterov momentum) or AdamW, no weight decay on
batch-norm parameters, biases and kernel-transformation matrices; a linear warm-up then cosine decay
over ``total_steps``. **Evaluation**: largest, smallest and a few random sub-networks, each after BN
recalibration on training batches.

Determinism: sub-networks come from :func:`supernet.config.sandwich_configs` (hash of the seed and the
step); data from :func:`tasks.sharding.shard_indices`; initial weights, augmentation and dropout from
explicit ``torch.Generator`` objects seeded from ``cfg.seed`` (:mod:`supernet.init`,
:func:`~supernet.training.batches.training_batch`, the ``generator`` of
:func:`~supernet.training.gradients.accumulate_gradients`). Torch's global generator is never seeded
nor relied on: threads share it, so a replay in one thread (a spot audit) could not be exact.
"""
