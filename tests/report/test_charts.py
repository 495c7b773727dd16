"""The per-epoch step-time chart: its pixels, its caption, and the image as TensorBoard stores and reads it.

Run this file as a script to write an example chart to /tmp/step_split_example.png (or the path given)."""

import io
import re
import struct
import sys
import time
import zlib

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lightning_perf.report.charts import (
    BACKGROUND_COLOUR,
    BASELINE_COLOUR,
    CLIP_COLOUR,
    COMPUTE_COLOUR,
    DATA_WAIT_COLOUR,
    GRID_COLOUR,
    step_split_caption,
    step_split_image,
)

TOP_MARGIN = 4  # rows above the plot area (room for the red caps over clipped bars)
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _is(img, colour):
    """Boolean mask of the pixels of ``img`` that are exactly ``colour``."""
    return np.all(img == np.array(colour, dtype=np.uint8), axis=-1)


def _bar_columns(img):
    """[(first, last)] column ranges of the bars, left to right: runs of columns with any bar colour."""
    coloured = (_is(img, DATA_WAIT_COLOUR) | _is(img, COMPUTE_COLOUR)).any(axis=0)
    edges = np.flatnonzero(np.diff(np.concatenate([[0], coloured.astype(np.int8), [0]])))
    return list(zip(edges[::2], edges[1::2] - 1, strict=True))


def _png(img):
    """A minimal PNG encoder: 8-bit RGB, filter 0 on every row, one IDAT chunk."""
    height, width, _ = img.shape

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    raw = np.concatenate([np.zeros((height, 1), np.uint8), img.reshape(height, -1)], axis=1).tobytes()
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return PNG_SIGNATURE + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")


def _png_chunks(data):
    """{chunk type: concatenated data} of a PNG, checking the signature and every CRC."""
    assert data[:8] == PNG_SIGNATURE
    chunks, pos = {}, 8
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])
        assert crc == zlib.crc32(kind + body), kind
        chunks[kind] = chunks.get(kind, b"") + body
        pos += 12 + length
    return chunks


def _png_size(data):
    """(width, height, bit depth, colour type) from a PNG's IHDR chunk."""
    width, height, depth, colour_type = struct.unpack(">IIBB", _png_chunks(data)[b"IHDR"][:10])
    return width, height, depth, colour_type


def _example():
    """Times that look like a real epoch: a loader that mostly keeps up, a periodic stall every 50 batches,
    one very slow batch (a checkpoint) and a few missing measurements."""
    rng = np.random.default_rng(7)
    n = 300
    data_wait = rng.gamma(2.0, 0.002, n)
    data_wait[::50] += 0.025
    data_wait[:3] = [0.06, 0.03, 0.02]  # workers starting up
    compute = rng.normal(0.028, 0.0015, n)
    compute[170] = 0.4
    data_wait[[90, 91]] = np.nan
    return data_wait, compute


def test_shape_and_dtype():
    img = step_split_image([0.01, 0.02, 0.005], [0.03, 0.01, 0.04], height=120, max_width=300)
    assert img.dtype == np.uint8
    assert img.ndim == 3 and img.shape[0] == 120 and img.shape[2] == 3
    assert 1 <= img.shape[1] <= 300
    # Only our palette is used: there is no anti-aliasing or blending.
    palette = {BACKGROUND_COLOUR, GRID_COLOUR, BASELINE_COLOUR, DATA_WAIT_COLOUR, COMPUTE_COLOUR, CLIP_COLOUR}
    assert {tuple(int(v) for v in p) for p in img.reshape(-1, 3)} <= palette


def test_colours_are_in_the_proportions_of_the_times():
    img = step_split_image([0.03, 0.01], [0.01, 0.03], height=200, max_width=101)
    bars = _bar_columns(img)
    assert len(bars) == 2
    (a0, a1), (b0, b1) = bars
    assert a1 - a0 == b1 - b0 and a1 - a0 + 1 >= 40, "two equal bars sharing the width"
    assert b0 == a1 + 2, "a 1 px gap between bars"
    for (first, last), (wait, compute) in zip(bars, [(0.03, 0.01), (0.01, 0.03)], strict=True):
        columns = img[:, first : last + 1]
        orange = _is(columns, DATA_WAIT_COLOUR).sum()
        blue = _is(columns, COMPUTE_COLOUR).sum()
        assert orange / blue == pytest.approx(wait / compute, rel=0.03)
        # Data wait at the bottom, compute on top: in every column, every orange row is below every blue row.
        rows = np.arange(img.shape[0])[:, None]
        lowest_blue = np.where(_is(columns, COMPUTE_COLOUR), rows, -1).max(axis=0)
        highest_orange = np.where(_is(columns, DATA_WAIT_COLOUR), rows, img.shape[0]).min(axis=0)
        assert (lowest_blue < highest_orange).all()
        # Each bar's columns are identical.
        assert (columns == columns[:, :1]).all()


def test_the_tallest_bar_fills_the_plot_area_and_the_others_are_in_proportion():
    height = 200
    totals = np.array([0.02, 0.05, 0.01, 0.04])
    img = step_split_image(totals / 2, totals / 2, height=height, max_width=400)
    baseline = height - 1
    plot_height = baseline - TOP_MARGIN
    assert _is(img[baseline], BASELINE_COLOUR).all()
    bars = _bar_columns(img)
    assert len(bars) == 4
    heights = [int((_is(img[:, c], DATA_WAIT_COLOUR) | _is(img[:, c], COMPUTE_COLOUR)).sum()) for c, _ in bars]
    assert heights[1] == plot_height
    coloured_rows = np.flatnonzero(_is(img[:, bars[1][0]], COMPUTE_COLOUR))
    assert coloured_rows.min() == TOP_MARGIN and coloured_rows.max() < baseline
    assert heights == [round(t / 0.05 * plot_height) for t in totals]
    assert not _is(img, CLIP_COLOUR).any(), "nothing is clipped when the scale is the tallest bar"


def test_gridlines_mark_quarters_of_the_scale():
    height = 105  # a plot area of 100 rows
    img = step_split_image([0.0], [0.0], height=height, max_width=10)
    baseline = height - 1
    grid_rows = np.flatnonzero(_is(img, GRID_COLOUR).all(axis=1))
    assert list(grid_rows) == [baseline - 100, baseline - 75, baseline - 50, baseline - 25]


@pytest.mark.parametrize(
    ("n", "max_width", "pitch", "bar_width", "overhang"),
    [
        (200, 800, 4, 3, 1),  # 3 px bars 1 px apart: the cap, 5 px at least, overhangs into the gaps
        (400, 800, 2, 2, 2),  # 2 px bars touching: the cap overhangs the neighbours
        (150, 1200, 8, 7, 0),  # 7 px bars: the cap is as wide as the bar
    ],
)
def test_an_outlier_is_clipped_at_the_99th_percentile_and_capped(n, max_width, pitch, bar_width, overhang):
    compute = np.full(n, 0.02)
    outlier = n // 3
    compute[outlier] = 1.0  # one batch 50x slower than the rest
    img = step_split_image(np.zeros(n), compute, height=100, max_width=max_width)
    baseline = 100 - 1
    blue = _is(img, COMPUTE_COLOUR)
    bar_columns = np.flatnonzero(np.arange(img.shape[1]) % pitch < bar_width)
    assert len(bar_columns) == n * bar_width and blue.any(axis=0).sum() == len(bar_columns)
    # The others are not flattened by the outlier: every bar, the outlier clipped, fills the plot area.
    assert blue[TOP_MARGIN:baseline, bar_columns].all() and not blue[:TOP_MARGIN].any()
    # Only the outlier carries the red cap, in the 3 rows just above the plot area, at least 5 px wide.
    first, last = outlier * pitch - overhang, outlier * pitch + bar_width - 1 + overhang
    capped = np.flatnonzero(_is(img, CLIP_COLOUR).any(axis=0))
    assert list(capped) == list(range(first, last + 1)) and len(capped) >= 5
    cap_rows = np.flatnonzero(_is(img, CLIP_COLOUR).any(axis=1))
    assert list(cap_rows) == [TOP_MARGIN - 3, TOP_MARGIN - 2, TOP_MARGIN - 1]
    assert _is(img[TOP_MARGIN - 3 : TOP_MARGIN, first : last + 1], CLIP_COLOUR).all()
    caption = step_split_caption(np.zeros(n), compute, max_width=max_width)
    assert "Full height = 20.0 ms (99th percentile; 1 taller bar clipped, marked with a red cap)" in caption


def test_with_100_bars_or_fewer_the_scale_is_the_tallest_bar():
    compute = np.full(100, 0.02)
    compute[40] = 1.0
    img = step_split_image(np.zeros(100), compute, height=100)
    assert not _is(img, CLIP_COLOUR).any()
    assert "Full height = 1.00 s (the tallest bar)" in step_split_caption(np.zeros(100), compute)


def test_many_batches_are_averaged_so_the_width_never_exceeds_max_width():
    rng = np.random.default_rng(0)
    data_wait, compute = rng.uniform(0, 0.01, 10_000), rng.uniform(0.01, 0.02, 10_000)
    for max_width in (800, 333, 64, 1):
        img = step_split_image(data_wait, compute, height=50, max_width=max_width)
        assert img.shape[0] == 50 and 1 <= img.shape[1] <= max_width
        assert (_is(img, DATA_WAIT_COLOUR) | _is(img, COMPUTE_COLOUR)).any(axis=0).sum() >= img.shape[1] * 0.9
    caption = step_split_caption(data_wait, compute, max_width=800)
    assert "10,000 batches" in caption and "13 consecutive batches averaged per bar (770 bars)" in caption
    assert step_split_image(data_wait, compute).shape[1] == 770


def test_averaging_takes_the_mean_of_each_part():
    # 6 batches into 3 px: pairs averaged. Means: wait (0.01, 0.0, 0.02), compute (0.03, 0.01, 0.0).
    data_wait = [0.02, 0.0, 0.0, 0.0, 0.04, 0.0]
    compute = [0.02, 0.04, 0.0, 0.02, 0.0, 0.0]
    img = step_split_image(data_wait, compute, height=105, max_width=3)
    assert img.shape == (105, 3, 3)
    orange, blue = _is(img, DATA_WAIT_COLOUR).sum(axis=0), _is(img, COMPUTE_COLOUR).sum(axis=0)
    assert list(orange) == [25, 0, 50] and list(blue) == [75, 25, 0]
    assert "2 consecutive batches averaged per bar (3 bars)" in step_split_caption(data_wait, compute, max_width=3)


@pytest.mark.parametrize(
    ("n", "width", "bars"),
    [
        (1, 800, 1),  # one bar the full width
        (10, 799, 10),  # 79 px bars, 1 px apart
        (267, 800, 267),  # the most bars that can be 2 px wide with gaps
        (268, 536, 1),  # 2 px bars without gaps: 1 px bars with 1 px gaps would read as a pale hatching
        (500, 500, 1),  # 1 px bars, touching
        (800, 800, 1),
    ],
)
def test_bars_share_the_width_with_1px_gaps_when_they_can_be_2px_wide(n, width, bars):
    img = step_split_image([0.01] * n, [0.01] * n, max_width=800)
    assert img.shape[1] == width
    assert len(_bar_columns(img)) == bars, "gaps split the coloured columns into one run per bar"


def test_empty_input_gives_a_blank_image_and_says_so():
    img = step_split_image([], [], height=64)
    assert img.shape == (64, 1, 3) and img.dtype == np.uint8 and (img == 255).all()
    assert "no batches" in step_split_caption([], [])


def test_nan_inf_and_negative_times_count_as_zero():
    dirty = step_split_image([0.01, np.nan, -1.0, 0.02], [np.inf, 0.03, 0.02, -np.inf], height=80, max_width=200)
    clean = step_split_image([0.01, 0.0, 0.0, 0.02], [0.0, 0.03, 0.02, 0.0], height=80, max_width=200)
    assert np.array_equal(dirty, clean)
    assert step_split_caption([0.01, np.nan, -1.0, 0.02], [np.inf, 0.03, 0.02, -np.inf]) == step_split_caption(
        [0.01, 0.0, 0.0, 0.02], [0.0, 0.03, 0.02, 0.0]
    )
    # All zero: empty bars on the grid, and a caption that does not divide by zero.
    img = step_split_image([np.nan] * 3, [0.0] * 3, height=40)
    assert not (_is(img, DATA_WAIT_COLOUR) | _is(img, COMPUTE_COLOUR)).any()
    assert "no step time to split" in step_split_caption([np.nan] * 3, [0.0] * 3)


def test_inputs_of_different_lengths_or_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="differ in length"):
        step_split_image([0.1, 0.2], [0.1])
    with pytest.raises(ValueError, match="height"):
        step_split_image([0.1], [0.1], height=3)
    with pytest.raises(ValueError, match="max_width"):
        step_split_caption([0.1], [0.1], max_width=0)


def test_the_inputs_are_not_modified():
    data_wait, compute = np.array([0.01, np.nan, -1.0]), np.array([0.02, 0.03, 0.04])
    step_split_image(data_wait, compute)
    step_split_caption(data_wait, compute)
    assert np.isnan(data_wait[1]) and data_wait[2] == -1.0


def test_the_caption_states_colours_count_scale_median_and_data_wait_share():
    caption = step_split_caption([0.03, 0.01, 0.002], [0.01, 0.03, 0.018])
    assert "\n" not in caption
    assert "**orange** = waiting for data" in caption and "**blue** = compute" in caption
    assert "3 batches" in caption and "averaged" not in caption
    assert "Full height = 40.0 ms (the tallest bar)" in caption
    assert re.search(r"Median step 40\.0 ms", caption)
    # Share: (0.03 + 0.01 + 0.002) / (0.04 + 0.04 + 0.02) = 42%.
    assert "data wait 42.0% of step time" in caption


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.0412, "41.2 ms"), (1.5, "1.50 s"), (0.000_45, "450 µs"), (0.123_4, "123 ms"), (0.005, "5.00 ms")],
)
def test_the_caption_picks_a_readable_unit(seconds, text):
    assert f"Full height = {text}" in step_split_caption([0.0], [seconds])
    assert f"Median step {text}" in step_split_caption([0.0], [seconds])


def test_rendering_is_fast():
    rng = np.random.default_rng(1)
    data_wait, compute = rng.gamma(2.0, 0.005, 800), rng.normal(0.03, 0.002, 800)
    step_split_image(data_wait, compute)  # warm up
    best = min(_timed(step_split_image, data_wait, compute) for _ in range(20))
    assert best < 0.010, f"a 200 x 800 chart took {best * 1e3:.1f} ms"


def _timed(fn, *args):
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def test_our_png_encoder_round_trips(tmp_path):
    img = step_split_image(*_example(), height=60, max_width=120)
    (tmp_path / "chart.png").write_bytes(_png(img))
    data = (tmp_path / "chart.png").read_bytes()
    assert _png_size(data) == (img.shape[1], img.shape[0], 8, 2)
    raw = np.frombuffer(zlib.decompress(_png_chunks(data)[b"IDAT"]), np.uint8).reshape(img.shape[0], -1)
    assert (raw[:, 0] == 0).all() and np.array_equal(raw[:, 1:].reshape(img.shape), img)


def test_tensorboard_stores_and_reads_back_the_image(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    img = step_split_image(*_example(), height=150, max_width=500)
    writer = SummaryWriter(str(tmp_path))
    writer.add_image("perf/x", img, 3, dataformats="HWC")
    writer.close()

    acc = EventAccumulator(str(tmp_path), size_guidance={"images": 0})
    acc.Reload()
    assert "perf/x" in acc.Tags()["images"], acc.Tags()
    (event,) = acc.Images("perf/x")
    assert event.step == 3
    assert (event.width, event.height) == (img.shape[1], img.shape[0])
    png = event.encoded_image_string
    width, height, depth, colour_type = _png_size(png)
    assert (width, height, depth, colour_type) == (img.shape[1], img.shape[0], 8, 2)
    # Pixel for pixel: uint8 in, so TensorBoard neither rescales nor resamples. Pillow is a dependency of
    # tensorboard (and what torch's add_image encodes with); decode with it rather than undo PNG filters here.
    from PIL import Image

    assert np.array_equal(np.asarray(Image.open(io.BytesIO(png)).convert("RGB")), img)


if __name__ == "__main__":
    path = sys.argv[1] if len(sys.argv) > 1 else "/tmp/step_split_example.png"
    data_wait, compute = _example()
    with open(path, "wb") as f:
        f.write(_png(step_split_image(data_wait, compute)))
    print(path)
    print(step_split_caption(data_wait, compute))
