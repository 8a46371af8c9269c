"""The streamed held-out images: uint8 chunks that normalise to `load_images`' tensors exactly."""

import pytest
import torch

from quantstudy.data.folders import scan_folder
from quantstudy.data.images import load_images
from quantstudy.data.stream import Uint8Transform, normalize, stream_chunks
from quantstudy.model.preprocess import EvalTransform
from quantstudy.record import Preprocessing

torch.set_num_threads(1)

_PRE = Preprocessing(
    input_size=(3, 32, 32),
    crop_pct=0.875,
    crop_mode="center",
    interpolation="bicubic",
    mean=(0.485, 0.456, 0.406),
    std=(0.229, 0.224, 0.225),
    settings="train",
    source="test",
)


def _streamed(items, transform, **kw):
    chunks = list(stream_chunks(items, transform, **kw))
    return chunks, torch.cat([normalize(b, transform) for c in chunks for b in c.batches])


@pytest.mark.parametrize("workers", [0, 1])
def test_streamed_images_equal_the_whole_set_bit_for_bit(tiny_imagenet, workers):
    items = scan_folder(tiny_imagenet).items
    want, _ = load_images(items, EvalTransform(_PRE))
    transform = Uint8Transform(EvalTransform(_PRE).steps)
    chunks, got = _streamed(items, transform, batch_size=5, chunk_batches=2, workers=workers)
    assert torch.equal(got, want)  # same bits: the divide and normalise steps are timm's own
    assert [c.start for c in chunks] == [0, 10]  # 12 images: a chunk of 10, then 2
    assert all(b.dtype == torch.uint8 for c in chunks for b in c.batches)  # held as uint8


def test_a_stream_resumes_at_a_chunk_boundary(tiny_imagenet):
    items = scan_folder(tiny_imagenet).items
    transform = Uint8Transform(EvalTransform(_PRE).steps)
    _, whole = _streamed(items, transform, batch_size=2, chunk_batches=2, workers=0)
    chunks, rest = _streamed(items, transform, batch_size=2, chunk_batches=2, start=8, workers=0)
    assert [c.start for c in chunks] == [8] and torch.equal(rest, whole[8:])
    with pytest.raises(ValueError, match="multiple of the chunk size"):
        next(stream_chunks(items, transform, batch_size=2, chunk_batches=2, start=3))


def test_a_transform_that_is_not_timms_eval_pipeline_is_refused():
    steps = EvalTransform(_PRE).steps
    with pytest.raises(ValueError, match="must end in Normalize"):
        Uint8Transform([*steps[:-1], steps[-2]])
