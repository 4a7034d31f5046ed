"""Lossy wire codecs for the cross-cohort outer step (DiLoCo pseudo-gradients) in hivemind's all-reduce.

A cohort keeps an error-feedback residue, ``v - what peers decode``, so the sender has to reproduce
the receivers' decode exactly: :func:`roundtrip`. The int codecs quantize blocks of :data:`BLOCK`
values onto ``q * 2**e`` (absmax scaling, the scale rounded up to a power of two). With a power-of-two
scale ``x / 2**e`` and ``q * 2**e`` are exact in float32, so decoding never rounds, and a decoded
tensor encodes onto the same grid again: ``roundtrip(roundtrip(x)) == roundtrip(x)``, bit for bit
(a value already in wire form crosses the wire unchanged).

Blocks count from the start of what is compressed, a whole tensor or one of hivemind's parts, so
``roundtrip(x)`` is what peers decode when the parts start at multiples of ``BLOCK``: the codecs'
``estimate_compression_ratio`` makes hivemind cut such parts for any ``part_size_bytes`` that is a
multiple of 64 KiB, and ``compress`` refuses a part of a split that is not aligned.

Wire format, ``runtime_pb2.Tensor.buffer``: MAGIC (4 bytes) | one int8 exponent per block | codes
(int8: a byte per value; int4: ``code + 8`` per nibble, low nibble first). Shape, dtype and
requires_grad travel in the message's own fields; decoding restores the original dtype and shape.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import torch
import torch.nn.functional as F
from hivemind.compression import (
    CompressionBase,
    CompressionInfo,
    Float16Compression,
    NoCompression,
    deserialize_torch_tensor,
)
from hivemind.compression import serialization as _serialization
from hivemind.proto import runtime_pb2

BLOCK = 256  # values per quantization block (one exponent byte each)
CODECS = ("none", "fp16", "int8", "int4")

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)  # quantized in float32, decoded to their own dtype
_MIN_EXPONENT = -128  # int8's floor; 2**-128 is still a float32 (subnormal), so q * 2**e stays exact
_FP32_MAX = float(torch.finfo(torch.float32).max)
_ALIGN_BYTES = 1 << 16  # parts are whole blocks whenever hivemind's part_size_bytes is a multiple of this


def _pow2(exponents: torch.Tensor) -> torch.Tensor:
    """``2.0 ** e`` as float32, built from the float64 bit pattern so that it is exact by construction."""
    return ((exponents.to(torch.int64) + 1023) << 52).view(torch.float64).float()


class _PowerOfTwoBlockwise(CompressionBase):
    """Blockwise absmax quantization onto codes in [-QMAX, QMAX] times a power-of-two block scale."""

    BITS: int
    QMAX: int
    MAGIC: bytes  # tells this format from hivemind's own for the same enum value (see the end of the module)

    def quantize(self, tensor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(codes, exponents)``: int8 codes, one per value, and one int8 exponent per block.

        Non-finite values are encoded deterministically, NaN as 0 and ±inf as ±float32 max, so that a
        stray inf cannot abort a swarm-wide all-reduce; :func:`roundtrip` refuses them instead."""
        x = torch.nan_to_num(tensor.detach().reshape(-1).to("cpu", torch.float32), 0.0, _FP32_MAX, -_FP32_MAX)
        blocks = F.pad(x, (0, -x.numel() % BLOCK)).view(-1, BLOCK)
        absmax = blocks.abs().amax(dim=1).double()
        # e = ceil(log2(absmax / QMAX)) without a rounded logarithm: with absmax = m * 2**k, m in [0.5, 1),
        # it is k - bits(QMAX), plus one when m > QMAX / 2**bits(QMAX). Exactness is what makes the codec
        # idempotent: a decoded block must find the same (or a finer) grid again.
        mantissa, k = torch.frexp(absmax)
        nbits = self.QMAX.bit_length()
        e = k - nbits + (mantissa > self.QMAX / 2**nbits).int()
        e = torch.where(absmax > 0, e, 0).clamp(_MIN_EXPONENT, 127)
        scale = _pow2(e)
        # Only blocks next to float32's max need this: a code must not round up past it to inf.
        limit = torch.floor(_FP32_MAX / scale.double()).clamp(max=self.QMAX).float()[:, None]
        q = torch.maximum(torch.minimum(torch.round(blocks / scale[:, None]), limit), -limit)
        return q.to(torch.int8).reshape(-1)[: x.numel()], e.to(torch.int8)

    @staticmethod
    def dequantize(codes: torch.Tensor, exponents: torch.Tensor) -> torch.Tensor:
        """The flat float32 values ``q * 2**e`` (exact: at most 7 significant bits, within float32's range)."""
        q = F.pad(codes.float(), (0, -codes.numel() % BLOCK)).view(-1, BLOCK)
        return (q * _pow2(exponents)[:, None]).reshape(-1)[: codes.numel()]

    def _pack(self, codes: torch.Tensor) -> bytes:
        return codes.numpy().tobytes()

    def _unpack(self, data: bytes, n: int) -> torch.Tensor:
        return torch.from_numpy(np.frombuffer(data, dtype=np.int8, count=n).copy())

    def compress(
        self, tensor: torch.Tensor, info: CompressionInfo, allow_inplace: bool = False
    ) -> runtime_pb2.Tensor:
        if tensor.dtype not in _FLOATS:
            raise ValueError(f"{type(self).__name__} encodes float32/16 and bfloat16, not {tensor.dtype}")
        if info.part_size is not None and info.part_size % BLOCK and info.descriptor.numel() > info.part_size:
            # Blocks of such parts differ from the whole tensor's: the sender's roundtrip (its error
            # feedback) would no longer be what peers decode. Loud beats a silently drifting residue.
            raise ValueError(f"parts of {info.part_size} values are not whole blocks of {BLOCK} values")
        codes, exponents = self.quantize(tensor)
        return runtime_pb2.Tensor(
            compression=self.compression_type,
            buffer=b"".join((self.MAGIC, exponents.numpy().tobytes(), self._pack(codes))),
            size=tensor.shape,
            dtype=str(tensor.dtype).removeprefix("torch."),
            requires_grad=tensor.requires_grad,
        )

    def extract(self, serialized_tensor: runtime_pb2.Tensor) -> torch.Tensor:
        buffer = serialized_tensor.buffer
        if buffer[: len(self.MAGIC)] != self.MAGIC:  # hivemind's own format of the enum value taken over
            raise ValueError(f"{type(self).__name__}: not this codec's message (a peer without wire_codecs?)")
        shape = tuple(serialized_tensor.size)
        n = math.prod(shape)
        nblocks = -(-n // BLOCK)
        start = len(self.MAGIC) + nblocks
        if len(buffer) != start + -(-n * self.BITS // 8):
            raise ValueError(f"{type(self).__name__}: {len(buffer)} bytes cannot hold shape {shape}")
        exponents = np.frombuffer(buffer, dtype=np.int8, count=nblocks, offset=len(self.MAGIC))
        values = self.dequantize(self._unpack(buffer[start:], n), torch.from_numpy(exponents.copy()))
        dtype = getattr(torch, serialized_tensor.dtype)
        return values.reshape(shape).to(dtype).requires_grad_(serialized_tensor.requires_grad)

    def estimate_compression_ratio(self, info: CompressionInfo) -> float:
        """Wire bytes per input byte, ``(BITS/8 + 1/BLOCK) / element size``, rounded up by under 0.01%.

        hivemind cuts parts of ``int(part_size_bytes / (element_size * ratio))`` values; the honest
        ratio would make that a multiple of BLOCK almost never. This one makes it exactly the whole
        blocks that fit in each 64 KiB of wire, for any ``part_size_bytes`` that is a multiple of 64 KiB
        (the tiny ``2**-20`` keeps the float division from truncating one value short)."""
        values = _ALIGN_BYTES // (BLOCK * self.BITS // 8 + 1) * BLOCK
        return _ALIGN_BYTES / (info.descriptor.dtype.itemsize * (values + 2**-20))


class PowerOfTwoInt8(_PowerOfTwoBlockwise):
    """int8 codes in [-127, 127], block scale ``2**ceil(log2(absmax / 127))``: ~n + n/256 wire bytes."""

    BITS, QMAX, MAGIC = 8, 127, b"P2q8"
    compression_type = runtime_pb2.CompressionType.BLOCKWISE_8BIT


class PowerOfTwoInt4(_PowerOfTwoBlockwise):
    """4-bit codes in [-7, 7], two per byte, block scale ``2**ceil(log2(absmax / 7))``: ~n/2 + n/256 bytes."""

    BITS, QMAX, MAGIC = 4, 7, b"P2q4"
    compression_type = runtime_pb2.CompressionType.QUANTILE_8BIT

    def _pack(self, codes: torch.Tensor) -> bytes:
        nibbles = F.pad(codes.to(torch.int16) + 8, (0, codes.numel() % 2)).view(-1, 2)
        return (nibbles[:, 0] | (nibbles[:, 1] << 4)).to(torch.uint8).numpy().tobytes()

    def _unpack(self, data: bytes, n: int) -> torch.Tensor:
        packed = torch.from_numpy(np.frombuffer(data, dtype=np.uint8).astype(np.int16))
        return (torch.stack((packed & 15, packed >> 4), dim=1).reshape(-1)[:n] - 8).to(torch.int8)


def codec_for(name: str) -> CompressionBase:
    """The codec a task's ``outer_compression`` names (one of :data:`CODECS`)."""
    makers = {
        "none": NoCompression,
        "fp16": Float16Compression,
        "int8": PowerOfTwoInt8,
        "int4": PowerOfTwoInt4,
    }
    if name not in makers:
        raise ValueError(f"unknown wire codec {name!r}; choose one of: {', '.join(CODECS)}")
    return makers[name]()


def rounding_bound(codec: CompressionBase, decoded: torch.Tensor) -> torch.Tensor | None:
    """Per value of ``decoded`` (what a receiver decoded), how far the value the sender encoded may
    have been from it: half a quantization step of its block (int codecs), half a float16 unit in the
    last place (fp16), or None where the wire is exact (none). A reducer's proof is checked against
    the decoded result (:mod:`robust_aggregation.reducer_proof`), and this is the leeway its codec gives."""
    if type(codec) is NoCompression:
        return None
    flat = decoded.detach().reshape(-1).to(torch.float32)
    if isinstance(codec, _PowerOfTwoBlockwise):
        _codes, exponents = codec.quantize(flat)  # a decoded tensor finds its own grid again (idempotent)
        half = _pow2(exponents.to(torch.int64) - 1).double()
        return half.repeat_interleave(BLOCK)[: flat.numel()]
    # fp16 (hivemind's own): half an ulp of the value, and of the smallest subnormal near zero
    return flat.double().abs() * 2.0**-11 + 2.0**-25


def roundtrip(codec: CompressionBase, tensor: torch.Tensor) -> torch.Tensor:
    """What a receiver decodes from ``codec.compress(tensor)`` (whole, or in block-aligned parts), bit
    for bit, in ``tensor``'s dtype, shape and device: the sender's side of error feedback. fp16 clamps
    to float16's range and casts there and back; none copies. Raises ValueError on NaN or inf, whose
    residue would poison every later exchange (compress alone still encodes them, see quantize)."""
    if not bool(torch.isfinite(tensor).all()):
        raise ValueError("roundtrip: the tensor holds NaN or inf")
    tensor = tensor.detach()
    if isinstance(codec, _PowerOfTwoBlockwise):
        out = codec.dequantize(*codec.quantize(tensor)).reshape(tensor.shape).to(tensor.dtype)
    elif type(codec) is NoCompression:
        out = tensor.clone()
    else:  # hivemind's own codecs, fp16 included: their own encode and decode, so exact by construction
        out = deserialize_torch_tensor(codec.compress(tensor.cpu(), CompressionInfo.from_tensor(tensor)))
    return out.to(tensor.device)


def wire_bytes(codec: CompressionBase, tensors: Iterable[torch.Tensor]) -> int:
    """Serialized bytes of sending ``tensors`` whole through ``codec`` (protobuf framing included)."""
    return sum(
        len(codec.compress(t.detach().cpu(), CompressionInfo.from_tensor(t)).SerializeToString())
        for t in tensors
    )


# hivemind decodes every received part with deserialize_torch_tensor, and its reducers re-encode their
# results with serialize_torch_tensor(part, <the part's enum>); both look the codec up in
# serialization._BASE_COMPRESSION_TYPES by CompressionType *name*. That enum is compiled from hivemind's
# runtime.proto and cannot gain values, so, as the only way in, each codec here takes over one 8-bit
# value this project never sends in that table, at import time (hivemind's own codecs for them do not
# even decode here: BLOCKWISE_8BIT needs bitsandbytes, QUANTILE_8BIT's extract fails on NumPy 2).
# Every process that sends or receives these codecs imports this module (an averager unpickling its
# compression does too); a message of those values without MAGIC is refused, not misread.
for _codec in (PowerOfTwoInt8(), PowerOfTwoInt4()):
    _serialization._BASE_COMPRESSION_TYPES[runtime_pb2.CompressionType.Name(_codec.compression_type)] = _codec
