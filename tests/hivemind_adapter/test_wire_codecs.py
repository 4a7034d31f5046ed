"""The outer step's wire codecs against real hivemind: what the sender reproduces with roundtrip() is
what hivemind's own decoding yields, whole or in hivemind's parts, and an all-reduce through them."""

from __future__ import annotations

import math

import pytest
import torch
from hivemind.averaging.partition import TensorPartContainer
from hivemind.compression import (
    CompressionInfo,
    Float16Compression,
    NoCompression,
    Quantile8BitQuantization,
    deserialize_torch_tensor,
    serialize_torch_tensor,
)

from hivemind_adapter.allreduce import VerifiedAverager
from hivemind_adapter.wire_codecs import (
    BLOCK,
    CODECS,
    PowerOfTwoInt4,
    PowerOfTwoInt8,
    codec_for,
    roundtrip,
    wire_bytes,
)
from tests.hivemind_adapter.averager_pair import step_pair

INT_CODECS = [pytest.param(PowerOfTwoInt8(), id="int8"), pytest.param(PowerOfTwoInt4(), id="int4")]
FP32_MAX = torch.finfo(torch.float32).max


def _decode(codec, tensor: torch.Tensor, info: CompressionInfo | None = None) -> torch.Tensor:
    """What a peer decodes: hivemind's own dispatch on the message's compression type."""
    return deserialize_torch_tensor(codec.compress(tensor, info or CompressionInfo.from_tensor(tensor)))


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.int32), b.view(torch.int32))


def _block_scales(x: torch.Tensor, qmax: int) -> torch.Tensor:
    """Per element, its block's scale by the definition 2**ceil(log2(absmax / qmax)) (1 for a zero block)."""
    flat = x.reshape(-1).double()
    scales = []
    for block in flat.split(BLOCK):
        absmax = block.abs().max().item()
        scale = 2.0 ** math.ceil(math.log2(absmax / qmax)) if absmax > 0 else 1.0
        scales.append(torch.full((block.numel(),), scale, dtype=torch.float64))
    return torch.cat(scales)


def _one_shard_each(got: torch.Tensor, first: torch.Tensor, second: torch.Tensor) -> bool:
    """Whether ``got`` is one of the two up to some index and the other from there on (each member
    reduces one contiguous shard of the averaged vector)."""
    for before, after in ((first, second), (second, first)):
        wrong = (got != before).nonzero()
        cut = int(wrong[0]) if len(wrong) else got.numel()
        if torch.equal(got[cut:], after[cut:]):
            return True
    return False


def _sample(seed: int, shape, magnitude: float) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return ((torch.rand(shape, generator=g, dtype=torch.float64) * 2 - 1) * magnitude).float()


@pytest.mark.parametrize("codec", INT_CODECS)
@pytest.mark.parametrize("shape", [(1001,), (37, 300), (16, 8, 3, 3)], ids=["odd-1d", "2d", "conv"])
def test_roundtrip_is_hivemind_decode_bit_for_bit(codec, shape):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(sum(shape)))
    got = _decode(codec, x)
    assert got.dtype == torch.float32 and got.shape == x.shape
    assert _same_bits(roundtrip(codec, x), got)
    assert not torch.equal(got, x), "a lossy codec that changed nothing is not encoding"


@pytest.mark.parametrize("name", ["none", "fp16"])
def test_hivemind_codecs_roundtrip_is_their_decode(name):
    x = torch.randn(3000, generator=torch.Generator().manual_seed(5)) * 1e3
    x[0] = 1e6  # past float16's range: clamped, not inf
    codec = codec_for(name)
    assert _same_bits(roundtrip(codec, x), _decode(codec, x))
    assert torch.isfinite(roundtrip(codec, x)).all()


@pytest.mark.parametrize("codec", INT_CODECS)
def test_roundtrip_is_idempotent_at_every_magnitude(codec):
    cases = [torch.zeros(1000)]
    for i, magnitude in enumerate([1e-45, 1e-40, 1e-30, 1e-3, 1.0, 7.0, 127.0, 1e3, 1e30, FP32_MAX]):
        cases.append(_sample(i, (2000,), magnitude))
    g = torch.Generator().manual_seed(9)
    spread = torch.rand(5000, generator=g, dtype=torch.float64) * 76 - 40
    cases.append((torch.randn(5000, generator=g, dtype=torch.float64) * 10.0**spread).float())  # 1e-40..1e36
    cases[-1][::BLOCK] = 0.0
    for x in cases:
        once = roundtrip(codec, x)
        assert torch.isfinite(once).all()
        assert _same_bits(roundtrip(codec, once), once)
        assert _same_bits(_decode(codec, once), once), "a value in wire form crosses the wire unchanged"
    assert torch.count_nonzero(roundtrip(codec, torch.zeros(1000))) == 0


@pytest.mark.parametrize(
    ("codec", "qmax"), [(PowerOfTwoInt8(), 127), (PowerOfTwoInt4(), 7)], ids=["int8", "int4"]
)
def test_error_is_at_most_half_a_block_scale(codec, qmax):
    for i, magnitude in enumerate([1e-20, 1e-3, 1.0, 1e20]):
        x = torch.randn(10_000, generator=torch.Generator().manual_seed(i)) * magnitude
        x[:BLOCK] *= 1e-3  # a quiet block next to loud ones keeps its own fine scale
        error = (x.double() - roundtrip(codec, x).double()).abs()
        scales = _block_scales(x, qmax)
        assert (error <= scales / 2).all()
        assert error[:BLOCK].max() < error[BLOCK:].max() / 100


def test_non_finite_values_are_refused_by_roundtrip_and_encoded_deterministically():
    x = torch.tensor([float("nan"), float("inf"), -float("inf"), 1.0, -2.0])
    for name in CODECS:
        with pytest.raises(ValueError, match="NaN or inf"):
            roundtrip(codec_for(name), x)
    for codec in (PowerOfTwoInt8(), PowerOfTwoInt4()):
        first, second = (
            codec.compress(x, CompressionInfo.from_tensor(x)).SerializeToString() for _ in range(2)
        )
        assert first == second
        decoded = _decode(codec, x)
        assert torch.isfinite(decoded).all() and decoded[0] == 0 and decoded[1] > 1e38 and decoded[2] < -1e38


@pytest.mark.parametrize("codec", INT_CODECS)
def test_parts_starting_at_block_multiples_decode_to_the_whole_roundtrip(codec):
    x = torch.randn(5000, generator=torch.Generator().manual_seed(3)) * torch.linspace(1e-3, 1e3, 5000)
    info = CompressionInfo.from_tensor(x)
    part_size = 3 * BLOCK
    parts = [_decode(codec, part, info.get_part(i, part_size)) for i, part in enumerate(x.split(part_size))]
    assert _same_bits(torch.cat(parts), roundtrip(codec, x))
    with pytest.raises(ValueError, match="not whole blocks"):
        codec.compress(x[1000:2000], info.get_part(1, 1000))


@pytest.mark.parametrize("codec", INT_CODECS)
def test_hivemind_cuts_whole_blocks_and_its_parts_decode_to_the_roundtrip(codec):
    for part_size_bytes in (
        64 * 1024,
        2**19,
        4 * 2**20,
    ):  # a test's, hivemind's default, peer.averaging.hierarchy's
        container = TensorPartContainer([torch.zeros(20_000_000)], (1.0,), codec, part_size_bytes)
        parts = [part for part, _info in container._input_parts_by_peer[0]]
        assert len(parts) > 1 and all(part.numel() % BLOCK == 0 for part in parts[:-1])
        assert parts[0].numel() * (BLOCK * codec.BITS // 8 + 1) // BLOCK <= part_size_bytes
    x = torch.randn(300_001, generator=torch.Generator().manual_seed(4))
    container = TensorPartContainer([x], (1.0,), codec, 64 * 1024)
    decoded = [_decode(codec, part, info) for part, info in container._input_parts_by_peer[0]]
    assert len(decoded) > 1 and _same_bits(torch.cat(decoded), roundtrip(codec, x))


def test_wire_bytes_and_honest_ratios():
    x = torch.randn(1_000_000, generator=torch.Generator().manual_seed(6))
    raw = wire_bytes(NoCompression(), [x])
    assert raw >= 4_000_000
    assert wire_bytes(codec_for("int8"), [x]) <= 0.27 * raw
    assert wire_bytes(codec_for("int4"), [x]) <= 0.14 * raw
    assert wire_bytes(codec_for("fp16"), [x]) <= 0.51 * raw
    assert wire_bytes(codec_for("int8"), [x, x[:10]]) == wire_bytes(codec_for("int8"), [x]) + wire_bytes(
        codec_for("int8"), [x[:10]]
    )
    info = CompressionInfo.from_tensor(x)
    assert PowerOfTwoInt8().estimate_compression_ratio(info) == pytest.approx((1 + 1 / 256) / 4, rel=1e-4)
    assert PowerOfTwoInt4().estimate_compression_ratio(info) == pytest.approx((0.5 + 1 / 256) / 4, rel=1e-4)


def test_codec_for_names():
    assert isinstance(codec_for("none"), NoCompression) and type(codec_for("fp16")) is Float16Compression
    assert isinstance(codec_for("int8"), PowerOfTwoInt8) and isinstance(codec_for("int4"), PowerOfTwoInt4)
    assert CODECS == ("none", "fp16", "int8", "int4")
    with pytest.raises(ValueError, match="none, fp16, int8, int4"):
        codec_for("int2")


def test_the_taken_over_enum_values_dispatch_to_these_codecs_and_refuse_hiveminds_format():
    x = torch.randn(4096, generator=torch.Generator().manual_seed(8))
    for codec in (PowerOfTwoInt8(), PowerOfTwoInt4()):
        message = codec.compress(x, CompressionInfo.from_tensor(x))
        assert serialize_torch_tensor(x, message.compression) == message  # a reducer re-encodes the same way
        message.buffer = Quantile8BitQuantization().compress(x, CompressionInfo.from_tensor(x)).buffer
        with pytest.raises(ValueError, match="not this codec's message"):
            deserialize_torch_tensor(message)


@pytest.mark.parametrize("codec", INT_CODECS)
def test_error_feedback_keeps_the_received_sum_within_a_block_scale(codec):
    g = torch.Generator().manual_seed(7)
    residue = torch.zeros(3000)
    sent, wanted, naive = (torch.zeros(3000, dtype=torch.float64) for _ in range(3))
    for _ in range(50):
        x = torch.randn(3000, generator=g) * 1e-2
        v = x + residue
        received = _decode(codec, v)  # what the peers get ...
        residue = v - roundtrip(codec, v)  # ... as the sender reproduces it
        sent += received.double()
        wanted += x.double()
        naive += roundtrip(codec, x).double()  # the same exchange without error feedback
    drift = (sent - wanted).abs()
    assert (drift <= _block_scales(v, codec.QMAX)).all()
    assert drift.max() < (naive - wanted).abs().max() / 2


def test_two_averagers_average_through_int8_to_the_same_bits():
    def tensors(seed: int) -> list[torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        return [torch.randn(200_000, generator=g) * 1e-2, torch.randn(17, generator=g)]

    results, outcomes, counted = step_pair(
        VerifiedAverager, tensors, 30, prefix="int8-pair", compression=PowerOfTwoInt8()
    )
    assert not any(isinstance(o, Exception) for o in outcomes), outcomes
    codec = PowerOfTwoInt8()
    assert all(_same_bits(a, b) for a, b in zip(*results)), "the members must hold the same bits"
    # Each member sent the other its part of the other's shard and sent back the averaged part of its
    # own shard: one's sent is the other's received, and each sent about the compressed vector once
    # (int8: a quarter of float32's bytes).
    (sent0, received0), (sent1, received1) = counted
    assert sent0 == received1 and sent1 == received0, counted
    whole = sum(len(codec.compress(t, CompressionInfo.from_tensor(t)).buffer) for t in tensors(0))
    assert 1.8 * whole <= sent0 + sent1 <= 2.2 * whole, (counted, whole)
    for got, a, b in zip(results[0], tensors(0), tensors(1)):
        # A reducer averages its own part as it is and the other's as decoded (weights 1), then sends the
        # mean through int8: on member 0's shard that is rt((a + rt(b)) / 2), on member 1's the converse.
        ra, rb = roundtrip(codec, a), roundtrip(codec, b)
        on_first, on_second = roundtrip(codec, (a + rb) / 2), roundtrip(codec, (ra + b) / 2)
        assert _one_shard_each(got, on_first, on_second)
        mean = (a + b) / 2
        scale = torch.maximum(
            _block_scales(mean, 127), torch.maximum(_block_scales(a, 127), _block_scales(b, 127))
        )
        assert ((got.double() - roundtrip(codec, mean).double()).abs() <= 2 * scale).all()
        assert not _same_bits(got, mean)
