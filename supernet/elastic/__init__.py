"""Elastic operations: layers whose active kernel size, width and depth are chosen per forward pass.

Stable API, shared by the classification and the stereo supernets. Every elastic op follows the same
four-method pattern, all driven by explicit arguments (no hidden "active" state at this level):

* ``forward(x, ...)`` — the active *input* width is read from ``x.shape[1]``; the active output width
  and kernel size are arguments;
* ``export(...) -> nn.Module`` — a static plain-torch layer with the sliced (and kernel-transformed)
  weights copied, giving the same output in eval mode;
* ``parameter_masks(...) -> dict[str, BoolTensor]`` — for every parameter of the op (keys relative to
  the op, as in ``named_parameters()``), which elements the active configuration uses. Exact: an
  element is marked if and only if it can receive a gradient (see
  :class:`~supernet.elastic.conv.ElasticConv2d` for the kernel-transformation matrices, where only
  some rows are used);
* ``macs(..., in_hw) -> (multiply_adds, out_hw)`` — analytic multiply-accumulate count.

Modules (import each name from its module; this package exports nothing itself):

* :mod:`~supernet.elastic.conv` — :class:`ElasticConv2d`: prefix-sliced input/output channels;
  optional elastic kernel size, the largest kernel's centre transformed to each smaller size by
  learned kernel-transformation matrices (once-for-all, Cai et al. 2020): from the largest size
  ``K0`` down the chain ``K0 > K1 > ... > k``, each step crops the centre ``K(i+1)×K(i+1)`` of the
  current kernel and multiplies its flattened values by a ``K(i+1)²×K(i+1)²`` matrix (initialised
  to the identity, shared across channels).
* :mod:`~supernet.elastic.batchnorm` — :class:`ElasticBatchNorm2d`: batch norm over the first ``C``
  channels of shared parameters and running statistics (recalibrate the statistics per sub-network
  before evaluating it).
* :mod:`~supernet.elastic.linear` — :class:`ElasticLinear`: prefix-sliced input features.
* :mod:`~supernet.elastic.blocks` — :class:`ElasticMBConv`, an inverted-residual (MobileNetV2/V3)
  block with elastic kernel size and expand ratio (elastic width of the middle layer), plus channel
  sorting by importance; :class:`ElasticUnit`, a stack of blocks with elastic depth (runs its first
  ``d`` blocks), the first carrying the stride and the channel change, the others identity shortcuts.
* :mod:`~supernet.elastic.masks` — the ``Masks`` type and helpers to build and prefix masks.
* :mod:`~supernet.elastic.permutation` — channel reorderings, recorded, and applied to optimizer state.
* :mod:`~supernet.elastic.sizes` — channel rounding (:func:`make_divisible`) and convolution output sizes.

Channel sorting (:meth:`ElasticMBConv.sort_channels`) reorders the middle channels of a block by
importance (L1 norm of the projection weights that read each channel, computed in float64 on the
CPU; ties keep their index order), so narrower sub-networks keep the most important channels. It is
a pure function of the parameters: peers with identical parameters end with identical parameters.
"""
