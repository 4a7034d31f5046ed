"""Once-for-all elastic supernets, sub-network configs, export, FLOPs and latency, search.

No networking here: everything in this package runs the same in a test, a peer or a search job.

    from supernet import ClassificationSupernet, SubnetConfig

The names below are imported when first used (see :mod:`supernet.lazy_exports`), so that importing a
light submodule (``supernet.search.options``) does not load torch.
"""

from supernet.lazy_exports import lazy_exports

_EXPORTS = {
    "ClassificationSupernet": "supernet.classification",
    "SearchSpace": "supernet.config",
    "StaticClassifier": "supernet.export",
    "StereoSupernet": "supernet.stereo.model",
    "SubnetConfig": "supernet.config",
    "derive_seed": "supernet.config",
    "recalibrate_bn": "supernet.bn",
    "sandwich_configs": "supernet.config",
    "save_exported_program": "supernet.export",
    "save_torchscript": "supernet.export",
    "torch_counted_macs": "supernet.flops",
    "training_flops_per_sample": "supernet.flops",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
