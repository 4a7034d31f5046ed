"""Content-addressed training data: packing a data set into shards once, and reading it back.

* :mod:`tasks.shards.container` — the shard file format (``write_shard`` / ``read_shard``);
* :mod:`tasks.shards.pack` — ``pack_dataset(kind, path, out_dir, ...)``: the shards, the
  :class:`~protocol.shards.DataManifest` and the signed :class:`~protocol.shards.DataSpec`;
* :mod:`tasks.shards.image_sources`, :mod:`tasks.shards.stereo_sources` — the on-disk layouts and
  their pack-time checks;
* :mod:`tasks.shards.dataset` — ``ShardDataset`` and ``shard_task(spec, manifest, locate)``: a
  :class:`~tasks.registry.Task` whose samples come from shard files.

Import the submodules you need; this package imports none of them, so it stays cheap.
"""
