"""``tensorflowonspark.dfutil``: Spark DataFrames to and from TFRecord files of ``tf.train.Example``.

The files are the ones TensorFlowOnSpark 2.2.5 reads and writes through its hadoop jar
(``org.tensorflow.hadoop.io.TFRecordFileInputFormat`` / ``...OutputFormat``), with no jar:
the TFRecord framing is :mod:`tfcoord.compat.tfrecord` (Python, CRC32C checked both ways),
the records are ``tf.train.Example`` protobufs built and parsed with TensorFlow's own
classes on the executors.

Where the bytes go: ``loadTFRecords`` reads through Spark (``binaryFiles``), so any
filesystem Spark reaches (HDFS, S3, local) works, one partition per file as the jar
gives; ``saveAsTFRecords`` writes from the executors through ``tf.io.gfile`` (local and
shared filesystems, and whatever TensorFlow's file systems add, e.g. ``gs://``), one
``part-r-NNNNN`` file per partition plus ``_SUCCESS``, as Hadoop's output committer does.

Types, as TensorFlowOnSpark maps them: int-like columns and arrays to ``Int64List``,
float/double to ``FloatList``, string and binary to ``BytesList``; back, ``Int64List`` to
``LongType``, ``FloatList`` to ``DoubleType``, ``BytesList`` to ``StringType`` (or
``BinaryType`` for the features named in ``binary_features``), a feature of more than
one value to an ``ArrayType`` and of exactly one to a scalar.
"""

from __future__ import annotations

import os
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from tfcoord.compat import tfrecord

#: DataFrames made by loadTFRecords, and the directory each came from. Weak: a
#: DataFrame nobody holds any more is forgotten, as is a derived one never registered.
loadedDF: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()

#: DataFrame dtypes (``df.dtypes``) and the tf.train.Feature list each becomes.
FLOAT_DTYPES = ("float", "double")
INT64_DTYPES = ("boolean", "tinyint", "smallint", "int", "bigint", "long")
BYTES_DTYPES = ("binary", "string")
FLOAT_LIST_DTYPES = tuple(f"array<{t}>" for t in FLOAT_DTYPES)
INT64_LIST_DTYPES = tuple(f"array<{t}>" for t in INT64_DTYPES)

#: Hadoop's names for what a job writes: part files per task, and the marker of a whole
#: output (readers such as TensorFlowOnSpark's skip files starting with "_" or ".").
PART_NAME = "part-r-{:05d}"
SUCCESS_NAME = "_SUCCESS"


def isLoadedDF(df: Any) -> bool:
    """Whether ``df`` itself (not one derived from it) was made by :func:`loadTFRecords`."""
    try:
        return df in loadedDF
    except TypeError:  # not weakly referenceable: not one of ours
        return False


def toTFExample(dtypes: Sequence[tuple[str, str]]) -> Callable[[Iterable[Any]], list[tuple[bytearray, None]]]:
    """A mapPartitions function: DataFrame rows to ``(serialized tf.train.Example, None)`` pairs.

    Args:
        dtypes: the source DataFrame's ``df.dtypes``, ``[(column, dtype), ...]``.

    The function raises ``ValueError`` naming the column for a dtype tf.train.Example
    cannot hold (maps, structs, nested arrays, decimals, dates).
    """
    unsupported = [f"{n} ({t})" for n, t in dtypes if t not in _FEATURE_OF]
    if unsupported:
        raise ValueError(
            f"cannot store column(s) {', '.join(unsupported)} in a tf.train.Example: it holds int64, float "
            "and bytes lists only; cast or drop those columns first"
        )
    columns = [(name, _FEATURE_OF[dtype]) for name, dtype in dtypes]

    def _to_examples(rows: Iterable[Any]) -> list[tuple[bytearray, None]]:
        import tensorflow as tf

        out = []
        for row in rows:
            feature = {name: convert(tf, row[name]) for name, convert in columns}
            example = tf.train.Example(features=tf.train.Features(feature=feature))
            out.append((bytearray(example.SerializeToString()), None))
        return out

    return _to_examples


def _floats(tf: Any, v: Any) -> Any:
    return tf.train.Feature(float_list=tf.train.FloatList(value=[v]))


def _ints(tf: Any, v: Any) -> Any:
    return tf.train.Feature(int64_list=tf.train.Int64List(value=[v]))


def _text(tf: Any, v: Any) -> Any:
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=[str(v).encode("utf-8")]))


def _binary(tf: Any, v: Any) -> Any:
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=[bytes(v)]))


def _float_list(tf: Any, v: Any) -> Any:
    return tf.train.Feature(float_list=tf.train.FloatList(value=v))


def _int_list(tf: Any, v: Any) -> Any:
    return tf.train.Feature(int64_list=tf.train.Int64List(value=v))


_FEATURE_OF: dict[str, Callable[[Any, Any], Any]] = {
    **dict.fromkeys(FLOAT_DTYPES, _floats),
    **dict.fromkeys(INT64_DTYPES, _ints),
    "string": _text,
    "binary": _binary,
    **dict.fromkeys(FLOAT_LIST_DTYPES, _float_list),
    **dict.fromkeys(INT64_LIST_DTYPES, _int_list),
}


def infer_schema(example: Any, binary_features: Sequence[str] = ()) -> Any:
    """The DataFrame schema (a ``StructType``, columns sorted by name) of one ``tf.train.Example``.

    ``binary_features`` names the BytesList features that hold bytes rather than UTF-8
    text (tf.train.Example does not tell them apart).
    """
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        DataType,
        DoubleType,
        LongType,
        StringType,
        StructField,
        StructType,
    )

    def sql_type(name: str, feature: Any) -> DataType:
        if name in binary_features:
            return BinaryType()
        base: DataType
        if feature.int64_list.value:
            values, base = feature.int64_list.value, LongType()
        elif feature.float_list.value:
            values, base = feature.float_list.value, DoubleType()
        else:
            values, base = feature.bytes_list.value, StringType()
        return ArrayType(base) if len(values) > 1 else base

    items = sorted(example.features.feature.items())
    return StructType([StructField(name, sql_type(name, f), True) for name, f in items])


def fromTFExample(records: Iterable[Any], binary_features: Sequence[str] = ()) -> list[Any]:
    """A mapPartitions function: ``(serialized tf.train.Example, _)`` pairs to DataFrame ``Row``s.

    A feature of several values becomes a list, of one value a scalar, of none ``None``;
    BytesList features are decoded as UTF-8 text unless named in ``binary_features``
    (then a ``bytearray``).
    """
    import tensorflow as tf
    from pyspark.sql import Row

    def value(name: str, feature: Any) -> Any:
        if feature.int64_list.value:
            values = feature.int64_list.value
        elif feature.float_list.value:
            values = feature.float_list.value
        elif name in binary_features:
            return bytearray(feature.bytes_list.value[0]) if feature.bytes_list.value else None
        else:
            return feature.bytes_list.value[0].decode("utf-8") if feature.bytes_list.value else None
        if len(values) > 1:
            return list(values)
        return values[0] if values else None

    rows = []
    for record in records:
        example = tf.train.Example()
        example.ParseFromString(bytes(record[0]))
        rows.append(Row(**{k: value(k, f) for k, f in sorted(example.features.feature.items())}))
    return rows


def saveAsTFRecords(df: Any, output_dir: str) -> None:
    """Write ``df`` as TFRecord files of ``tf.train.Example``, one ``part-r-NNNNN`` per partition.

    Raises:
        FileExistsError: ``output_dir`` exists already (as Hadoop refuses an existing
            output directory; remove it or pick another).
    """
    import tensorflow as tf

    path = _local(output_dir)
    if tf.io.gfile.exists(path):
        raise FileExistsError(f"output directory {output_dir} already exists: remove it or choose another")
    tf.io.gfile.makedirs(path)
    to_examples = toTFExample(df.dtypes)
    attempt = uuid.uuid4().hex  # names this job's temporary files, so a retry never reads them

    def write_partition(index: int, rows: Iterator[Any]) -> Iterator[int]:
        import tensorflow as tf

        final = f"{path}/{PART_NAME.format(index)}"
        tmp = f"{path}/.{PART_NAME.format(index)}.{attempt}.tmp"
        with tf.io.gfile.GFile(tmp, "wb") as f:
            f.write(b"")  # GFile creates the file only on a write: an empty partition's part is empty
            n = tfrecord.write(f, (record for record, _ in to_examples(rows)))
        tf.io.gfile.rename(tmp, final, overwrite=True)  # a task retry replaces its own part
        yield n

    df.rdd.mapPartitionsWithIndex(write_partition).sum()
    with tf.io.gfile.GFile(f"{path}/{SUCCESS_NAME}", "wb") as f:
        f.write(b"")  # GFile creates the file only on a write


def loadTFRecords(sc: Any, input_dir: str, binary_features: Sequence[str] = ()) -> Any:
    """A DataFrame of the ``tf.train.Example`` records in the TFRecord files under ``input_dir``.

    ``input_dir`` is a directory (its files whose names start with ``_`` or ``.`` are
    skipped, as Hadoop does), a file, or a glob, on any filesystem Spark reads. The
    schema is inferred from the first record (:func:`infer_schema`); ``binary_features``
    names the BytesList features to load as binary rather than text. One partition per
    file.

    Raises:
        FileNotFoundError: nothing matches ``input_dir``, or it holds no TFRecord file.
        tfcoord.compat.tfrecord.TFRecordError: a file is not valid TFRecord data.
    """
    import tensorflow as tf

    files = _list_files(sc, input_dir)
    if not files:
        raise FileNotFoundError(f"no TFRecord files under {input_dir}")
    binary = tuple(binary_features)
    raw = sc.union([sc.binaryFiles(f) for f in files]) if len(files) > 1 else sc.binaryFiles(files[0])

    def records(pairs: Iterable[tuple[str, bytes]]) -> Iterator[tuple[bytes, None]]:
        for name, data in pairs:
            for record in tfrecord.decode(data, name):
                yield (record, None)

    tfr_rdd = raw.mapPartitions(records)
    first = tfr_rdd.take(1)
    if not first:
        raise ValueError(f"the TFRecord files under {input_dir} hold no record to infer a schema from")
    example = tf.train.Example()
    example.ParseFromString(bytes(first[0][0]))
    schema = infer_schema(example, binary)
    df = tfr_rdd.mapPartitions(lambda it: fromTFExample(it, binary)).toDF(schema)
    loadedDF[df] = input_dir
    return df


def _local(path: str) -> str:
    """``path`` as TensorFlow's file systems name it (``file:`` URIs become plain paths)."""
    if path.startswith("file://"):
        return path[len("file://") :] or "/"
    if path.startswith("file:"):
        return path[len("file:") :]
    return os.path.abspath(path) if "://" not in path else path


def _list_files(sc: Any, input_dir: str) -> list[str]:
    """The data files ``input_dir`` names, through Spark's Hadoop filesystems, sorted."""
    jvm = sc._jvm
    conf = sc._jsc.hadoopConfiguration()
    hpath = jvm.org.apache.hadoop.fs.Path(input_dir)
    fs = hpath.getFileSystem(conf)
    statuses = fs.globStatus(hpath) or []
    files: list[str] = []
    for status in statuses:
        found = fs.listStatus(status.getPath()) if status.isDirectory() else [status]
        for st in found:
            name = st.getPath().getName()
            if st.isFile() and not name.startswith(("_", ".")):
                files.append(st.getPath().toString())
    return sorted(files)


__all__ = ["fromTFExample", "infer_schema", "isLoadedDF", "loadTFRecords", "saveAsTFRecords", "toTFExample"]
