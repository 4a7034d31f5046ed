"""Batch augmentation from an explicit generator: reproducible from the seed alone, the same kinds of
augmentation (and parameters) the tasks used torchvision's random transforms for, and no draws from
torch's global generator."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tasks import get_task
from tasks.augmentation import ImageAugmentation, _uniform, normalised_black
from tasks.transforms import affine_jitter, crop_and_flip


def _batch(n: int = 64, channels: int = 3, size: int = 16) -> torch.Tensor:
    return torch.randn(n, channels, size, size, generator=torch.Generator().manual_seed(99))


def _run(augmentation: ImageAugmentation, images: torch.Tensor, seed: int) -> torch.Tensor:
    return augmentation(images, torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(
    "augmentation", [crop_and_flip(16, hflip=True, crop_padding=4), affine_jitter((0.5,) * 3, (0.25,) * 3)]
)
def test_same_seed_same_output_other_seed_other_output_global_generator_untouched(augmentation):
    images = _batch()
    before = images.clone()
    torch.manual_seed(0)
    state = torch.get_rng_state()
    first = _run(augmentation, images, 1)
    torch.rand(100)  # whatever happens to the global generator in between does not matter
    assert torch.equal(first, _run(augmentation, images, 1))
    assert not torch.equal(first, _run(augmentation, images, 2))
    assert first.shape == images.shape and first.dtype == images.dtype
    assert torch.equal(images, before)  # the input is not modified
    torch.manual_seed(0)
    _run(augmentation, images, 3)
    assert torch.equal(torch.get_rng_state(), state)


def test_crop_takes_a_window_of_the_reflect_padded_image():
    pad, size = 4, 16
    images = _batch(size=size)
    out = _run(ImageAugmentation(crop_padding=pad), images, 5)
    padded = F.pad(images, (pad,) * 4, mode="reflect")
    offsets = set()
    for image, crop in zip(padded, out, strict=True):
        found = [
            (y, x)
            for y in range(2 * pad + 1)
            for x in range(2 * pad + 1)
            if torch.equal(image[:, y : y + size, x : x + size], crop)
        ]
        assert found, "every crop is a window of the padded image"
        offsets.add(found[0])
    assert len(offsets) > 10  # offsets vary over the batch
    assert all(0 <= y <= 2 * pad and 0 <= x <= 2 * pad for y, x in offsets)


def test_flip_happens_with_its_probability():
    images = _batch(n=2000, size=4)
    out = _run(ImageAugmentation(hflip=0.5), images, 7)
    flipped = torch.tensor([torch.equal(o, i.flip(-1)) for o, i in zip(out, images, strict=True)])
    kept = torch.tensor([torch.equal(o, i) for o, i in zip(out, images, strict=True)])
    assert bool((flipped ^ kept).all())  # each image is either flipped or untouched
    assert 0.45 < flipped.float().mean().item() < 0.55
    assert torch.equal(_run(ImageAugmentation(hflip=0.0), images, 7), images)
    assert torch.equal(_run(ImageAugmentation(hflip=1.0), images, 7), images.flip(-1))


def test_affine_jitter_keeps_most_pixels_and_fills_with_normalised_black():
    mean, std = (0.3,), (0.2,)
    assert normalised_black(mean, std)[0] == pytest.approx(-1.5)
    black = torch.tensor(normalised_black(mean, std)[0], dtype=torch.float32).item()
    images = (torch.rand(256, 1, 32, 32, generator=torch.Generator().manual_seed(3)) - 0.3) / 0.2
    out = _run(affine_jitter(mean, std), images, 11)
    assert out.shape == images.shape
    changed = [not torch.equal(o, i) for o, i in zip(out, images, strict=True)]
    assert sum(changed) > 250  # a continuous angle and scale: almost every image moves
    values = set(images.flatten().tolist()) | {black}
    assert set(out.flatten().tolist()) <= values  # nearest neighbour: pixels or the fill, nothing new
    assert (out == black).any()


@pytest.mark.parametrize(
    "degrees, translate, scale, shape",
    [(10.0, 0.1, (0.9, 1.1), (512, 1, 32, 32)), (45.0, 0.2, (0.7, 1.3), (128, 3, 24, 40))],
)
def test_the_affine_warp_is_torchvisions_affine(degrees, translate, scale, shape):
    # Written in torch to spare every process that warps a batch the import of torchvision: the same
    # geometry, checked against it with the draws the warp made (only pixels whose source lies on a
    # rounding tie may differ: 4 in 2 million at digits' parameters).
    from torchvision.transforms import v2

    fill = tuple(float(-1 - c) for c in range(shape[1]))
    images = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    out = _run(ImageAugmentation(degrees=degrees, translate=translate, scale=scale, fill=fill), images, 5)
    batch, _, height, width = shape
    g = torch.Generator().manual_seed(5)
    angles = _uniform(batch, -degrees, degrees, g)
    dx = _uniform(batch, -translate * width, translate * width, g)
    dy = _uniform(batch, -translate * height, translate * height, g)
    scales = _uniform(batch, *scale, g)
    expected = torch.stack(
        [
            v2.functional.affine(
                image,
                angle=a,
                translate=[round(x), round(y)],
                scale=s,
                shear=[0.0, 0.0],
                interpolation=v2.InterpolationMode.NEAREST,
                fill=list(fill),
            )  # fmt: skip
            for image, a, x, y, s in zip(images, angles, dx, dy, scales, strict=True)
        ]
    )
    assert (out == expected).float().mean().item() > 0.9999
    assert sum(torch.equal(o, e) for o, e in zip(out, expected, strict=True)) >= 0.99 * batch


def test_parameters_are_validated():
    bad_values = dict(degrees=-1, translate=2, scale=(1.2, 1.1), crop_padding=-1, hflip=1.5)
    for name, value in bad_values.items():
        with pytest.raises(ValueError, match=f"^{name}"):
            ImageAugmentation(**{name: value})
    with pytest.raises(ValueError, match="^inputs"):
        ImageAugmentation(hflip=0.5)(torch.zeros(3, 8, 8), torch.Generator())


def test_tasks_augment_training_batches_as_their_torchvision_pipelines_did():
    digits = get_task("digits")
    assert digits.augmentation == ImageAugmentation(
        degrees=10.0, translate=0.1, scale=(0.9, 1.1), fill=digits.augmentation.fill
    )
    assert get_task("digits", augment=False).augmentation is None
    assert crop_and_flip(32) == ImageAugmentation(crop_padding=4)
    assert crop_and_flip(24, hflip=True) == ImageAugmentation(crop_padding=3, hflip=0.5)
