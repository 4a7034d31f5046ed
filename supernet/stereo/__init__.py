"""Stereo-depth once-for-all supernet: a DispNetC-like encoder–decoder with a 1-D correlation layer.

Layout (strides relative to the input; every searchable unit halves the resolution)::

    left, right ─ stem (3×3, full res) ─ units[0] ─ units[1] ─ units[2]      siamese: one pass, shared weights
                                          1/2        1/4        1/8
    correlation_1d(left 1/8, right 1/8; d = 0..D)  ⊕  redir(left 1/8)  = cost features (1/8)
    cost ─ units[3] ─ units[4] ─ units[5]                                     1/16, 1/32, 1/64
    decoder: pr6 at 1/64, then 6 × (transposed conv ×2, ⊕ skip, ⊕ ↑previous disparity, 3×3 conv,
    disparity = ↑previous + 3×3 conv) with skips units[4], units[3], cost, units[1] ⊕ fine cost,
    units[0], stem (left features), giving pr5 … pr0 at 1/32 … 1/1.

The fine cost (``fine_correlation=True``, the default) is the same correlation layer applied once more
to the 1/4 features, over 2·D displacements (the same range in pixels); it joins the decoder's 1/4
skip and gives the fine levels a direct matching signal. It costs H/4·(W/4)²·C multiply-adds.

``net.units`` holds exactly the 6 searchable :class:`~supernet.elastic.blocks.ElasticUnit` s (elastic
kernel size, expand ratio and depth, the classification supernet's operations and
:class:`~supernet.config.SubnetConfig`); the stem, the redirection conv, the correlation and the
decoder are fixed. In training mode the forward pass returns the 7 predictions coarse → fine; in eval
mode only the finest (B×1×H×W). Every prediction is a left-referenced disparity in **full-resolution
pixels** (the head's raw output times ``disparity_scale``), so coarse predictions are compared with
the ground truth after plain bilinear up-sampling (``tasks.stereo.MultiScaleLoss``).

Inputs are two B×3×H×W images in [0, 1] of the same size, H and W multiples of the stride (64);
anything else raises ``ValueError`` — pad with ``tasks.stereo.pad_to_multiple`` and crop the result
with ``tasks.stereo.unpad``, or call ``tasks.stereo.predict_disparity``, which does both (for the
supernet and for exported models alike).

The correlation (:func:`~supernet.stereo.correlation.correlation_1d`) is the Caffe ``Correlation1D``
with kernel 1, one-sided: ``cost[:, d, y, x] = mean_c left[c, y, x] · right[c, y, x − d]`` for
d = 0 … D (0 where x − d < 0). It is computed as one batched all-pairs matrix product per image row
plus a gather of the D + 1 diagonals — vectorised, no Python loop over displacements.

Modules (import each name from its module; this package exports nothing itself):

* :mod:`~supernet.stereo.model` — :class:`StereoSupernet`, the elastic network;
* :mod:`~supernet.stereo.static` — :class:`StaticStereo`, a deployed sub-network of plain torch layers;
* :mod:`~supernet.stereo.decoder` — :class:`StereoDecoder`, the fixed decoder both share;
* :mod:`~supernet.stereo.correlation` — the 1-D correlation and the cost features it builds;
* :mod:`~supernet.stereo.layout` — the fixed layout (units, stride, input normalisation) and the
  input check, :func:`check_stereo_input`.
"""
