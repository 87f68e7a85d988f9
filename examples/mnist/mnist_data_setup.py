"""MNIST-shaped data with no download: TensorFlowOnSpark's CSV and TFRecord layouts from scikit-learn's digits.

    python examples/mnist/mnist_data_setup.py --output data/mnist [--num_partitions 10]

Writes what TensorFlowOnSpark's ``mnist_data_setup.py`` writes from ``tensorflow_datasets``
(which needs the internet), so its MNIST examples run unchanged anywhere:

* ``OUTPUT/csv/{train,test}/part-NNNNN``: one line per image, ``label,pixel0,...,pixel783``;
* ``OUTPUT/tfr/{train,test}/part-r-NNNNN``: TFRecord files of ``tf.train.Example`` with
  ``label`` (int64) and ``image`` (784 int64);

60,000 train and 10,000 test records (``keras/mnist_spark.py`` counts on 60,000), grey
levels 0-255, 28x28, in ``--num_partitions`` files each, plus Hadoop's ``_SUCCESS``.

The images are the 1,797 real handwritten digits that ship with scikit-learn
(``load_digits``: 8x8, 17 grey levels), each upsampled to a 20x20 box centred in 28x28 as
MNIST's are, and multiplied by small sub-pixel shifts (up to ``--max_shift`` pixels each
way). Train and test come from disjoint sets of writers' digits, so test accuracy measures
digits the model never saw, not shifted copies of them. Deterministic for a given
``--seed``.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
from pathlib import Path

import numpy as np

#: Every TEST_EVERY-th real digit is held out for the test set (about 1 in 6, as in MNIST).
TEST_EVERY = 6
#: MNIST's digits fill a 20x20 box centred in the 28x28 image.
SIDE, BOX = 28, 20


def upsample(digits: np.ndarray) -> np.ndarray:
    """8x8 digits (0-16) to float 28x28 images (0-255), the digit in the central 20x20 box."""
    from scipy import ndimage

    out = np.zeros((len(digits), SIDE, SIDE), dtype=np.float32)
    pad = (SIDE - BOX) // 2
    for i, d in enumerate(digits):
        box = ndimage.zoom(d.reshape(8, 8).astype(np.float32) * (255.0 / 16.0), BOX / 8, order=1)
        out[i, pad : pad + BOX, pad : pad + BOX] = box
    return out


def variants(images: np.ndarray, labels: np.ndarray, count: int, max_shift: float, rng: np.random.Generator):
    """``count`` (image, label) pairs: the images in turn, each shifted by a random sub-pixel offset."""
    from scipy import ndimage

    picks = np.resize(np.arange(len(images)), count)
    rng.shuffle(picks)
    shifts = rng.uniform(-max_shift, max_shift, size=(count, 2))
    out = np.empty((count, SIDE * SIDE), dtype=np.uint8)
    for i, (k, (dy, dx)) in enumerate(zip(picks, shifts, strict=True)):
        shifted = ndimage.shift(images[k], (dy, dx), order=1, mode="constant")
        out[i] = np.clip(np.rint(shifted), 0, 255).astype(np.uint8).reshape(-1)
    return out, labels[picks].astype(np.int64)


def make(num_train: int, num_test: int, max_shift: float, seed: int):
    """((train images, labels), (test images, labels)): uint8 784-vectors and int64 labels."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images, labels = upsample(digits.data), digits.target
    test = np.arange(len(labels)) % TEST_EVERY == 0
    rng = np.random.default_rng(seed)
    train_set = variants(images[~test], labels[~test], num_train, max_shift, rng)
    test_set = variants(images[test], labels[test], num_test, max_shift, rng)
    return train_set, test_set


def _parts(n: int, parts: int) -> list[slice]:
    bounds = np.linspace(0, n, parts + 1).astype(int)
    return [slice(int(a), int(b)) for a, b in itertools.pairwise(bounds)]


def write_csv(directory: Path, images: np.ndarray, labels: np.ndarray, parts: int) -> None:
    directory.mkdir(parents=True)
    for i, part in enumerate(_parts(len(labels), parts)):
        with open(directory / f"part-{i:05d}", "w") as f:
            for label, image in zip(labels[part], images[part], strict=True):
                f.write(f"{label},{','.join(map(str, image.tolist()))}\n")
    (directory / "_SUCCESS").touch()


def write_tfr(directory: Path, images: np.ndarray, labels: np.ndarray, parts: int) -> None:
    import tensorflow as tf

    from tfcoord.compat import tfrecord

    directory.mkdir(parents=True)
    for i, part in enumerate(_parts(len(labels), parts)):
        with open(directory / f"part-r-{i:05d}", "wb") as f:
            for label, image in zip(labels[part], images[part], strict=True):
                example = tf.train.Example(
                    features=tf.train.Features(
                        feature={
                            "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)])),
                            "image": tf.train.Feature(int64_list=tf.train.Int64List(value=image.tolist())),
                        }
                    )
                )
                f.write(tfrecord.encode(example.SerializeToString()))
    (directory / "_SUCCESS").touch()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--output", default="data/mnist", help="directory to write csv/ and tfr/ under")
    ap.add_argument("--num_partitions", type=int, default=10, help="files per split (as TFoS's setup)")
    ap.add_argument("--num_train", type=int, default=60_000)
    ap.add_argument("--num_test", type=int, default=10_000)
    ap.add_argument("--max_shift", type=float, default=2.0, help="largest shift, in pixels, each way")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--formats", default="csv,tfr", help="comma list of csv, tfr")
    args = ap.parse_args(argv)
    out = Path(args.output)
    formats = {f for f in args.formats.split(",") if f}
    if formats - {"csv", "tfr"} or not formats:
        ap.error(f"--formats takes csv and/or tfr, not {args.formats!r}")
    if args.num_partitions < 1 or args.num_train < 1 or args.num_test < 1:
        ap.error("--num_partitions, --num_train and --num_test must be at least 1")
    clash = [str(out / f) for f in sorted(formats) if (out / f).exists()]
    if clash:
        ap.error(f"{', '.join(clash)} already exist(s): remove it, or choose another --output")
    (train_x, train_y), (test_x, test_y) = make(args.num_train, args.num_test, args.max_shift, args.seed)
    for split, x, y in (("train", train_x, train_y), ("test", test_x, test_y)):
        if "csv" in formats:
            write_csv(out / "csv" / split, x, y, args.num_partitions)
        if "tfr" in formats:
            write_tfr(out / "tfr" / split, x, y, args.num_partitions)
    print(
        f"wrote {args.num_train} train and {args.num_test} test records ({', '.join(sorted(formats))}) "
        f"under {os.path.abspath(out)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
