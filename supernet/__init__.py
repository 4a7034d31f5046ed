"""Once-for-all elastic supernets, sub-network configs, export, FLOPs and latency, search.

No networking here: everything in this package runs the same in a test, a peer or a search job.

    from supernet import ClassificationSupernet, SubnetConfig
"""

from supernet.bn import recalibrate_bn
from supernet.classification import ClassificationSupernet
from supernet.config import SearchSpace, SubnetConfig, derive_seed, sandwich_configs
from supernet.export import StaticClassifier, save_exported_program, save_torchscript
from supernet.flops import torch_counted_macs, training_flops_per_sample
from supernet.stereo import StereoSupernet

__all__ = [
    "ClassificationSupernet",
    "SearchSpace",
    "StaticClassifier",
    "StereoSupernet",
    "SubnetConfig",
    "derive_seed",
    "recalibrate_bn",
    "sandwich_configs",
    "save_exported_program",
    "save_torchscript",
    "torch_counted_macs",
    "training_flops_per_sample",
]
