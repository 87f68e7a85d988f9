"""tensorflowonspark.dfutil and .pipeline on the session's Spark cluster (2 executors x 1 core),
used as TensorFlowOnSpark's own tests use them."""

from __future__ import annotations

import os

import pytest

tf = pytest.importorskip("tensorflow", reason="the TensorFlow extra is not installed")

from tfcoord.compat import tfrecord  # noqa: E402
from tfcoord.compat.tensorflowonspark import dfutil, pipeline  # noqa: E402
from tfcoord.compat.tensorflowonspark.pipeline import TFEstimator  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

WEIGHTS = (3.14, 1.618)


@pytest.fixture(scope="module")
def spark(sc):
    from pyspark.sql import SparkSession

    return SparkSession(sc)


def test_dataframe_to_tfrecords_and_back(sc, spark, tmp_path):
    row = ("text string", 1, [2, 3, 4, 5], -1.1, [-2.2, -3.3, -4.4, -5.5], bytearray(b"\xff\xfe\xfd\xfc"))
    df1 = spark.createDataFrame(sc.parallelize([row] * 3, 3), ["a", "b", "c", "d", "e", "f"])
    out = tmp_path / "tfr"
    dfutil.saveAsTFRecords(df1, str(out))
    assert sorted(os.listdir(out)) == ["_SUCCESS", "part-r-00000", "part-r-00001", "part-r-00002"]
    with pytest.raises(FileExistsError, match="already exists"):
        dfutil.saveAsTFRecords(df1, str(out))

    df2 = dfutil.loadTFRecords(sc, str(out), binary_features=["f"])
    assert df2.rdd.getNumPartitions() == 3  # one per file, as the hadoop jar reads them
    assert [f.dataType.simpleString() for f in df2.schema.fields] == [
        "string",
        "bigint",
        "array<bigint>",
        "double",
        "array<double>",
        "binary",
    ]
    got = df2.collect()
    assert len(got) == 3
    r = got[0]
    assert (r["a"], r["b"], r["c"]) == row[:3]
    assert r["d"] == pytest.approx(row[3], abs=1e-6) and r["e"] == pytest.approx(row[4], abs=1e-6)
    assert bytes(r["f"]) == bytes(row[5])
    assert not dfutil.isLoadedDF(df1) and dfutil.isLoadedDF(df2)
    assert not dfutil.isLoadedDF(df2.filter(df2.a == "x"))  # derived: not the loaded one

    # TensorFlow reads what we wrote, and we read what TensorFlow wrote.
    parts = sorted(str(p) for p in out.glob("part-*"))
    examples = [tf.train.Example.FromString(b.numpy()) for b in tf.data.TFRecordDataset(parts)]
    assert [e.features.feature["b"].int64_list.value[0] for e in examples] == [1, 1, 1]
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    with tf.io.TFRecordWriter(str(theirs / "part-0")) as w:
        for i in range(5):
            feature = {"x": tf.train.Feature(int64_list=tf.train.Int64List(value=[i, -i]))}
            w.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    assert [r.x for r in dfutil.loadTFRecords(sc, str(theirs)).collect()] == [[i, -i] for i in range(5)]
    with open(parts[0], "rb") as f:  # and our reader sees the same records as TensorFlow
        assert len(list(tfrecord.read(f))) == 1


def test_an_empty_partition_is_written_as_an_empty_part_file(sc, spark, tmp_path):
    # TensorFlowOnSpark's test_dfutils saves one row from sc.parallelize([row]): with the
    # default parallelism of 2, one partition is empty (the hadoop jar writes an empty part).
    df = spark.createDataFrame(sc.parallelize([("only", 7)], 2), ["a", "b"])
    out = tmp_path / "tfr"
    dfutil.saveAsTFRecords(df, str(out))
    assert sorted(os.listdir(out)) == ["_SUCCESS", "part-r-00000", "part-r-00001"]
    assert sorted(os.path.getsize(out / p) for p in ("part-r-00000", "part-r-00001"))[0] == 0
    assert [tuple(r) for r in dfutil.loadTFRecords(sc, str(out)).collect()] == [("only", 7)]


def test_estimator_fits_on_a_dataframe_and_the_model_transforms_one(sc, spark, tmp_path):
    def train_fn(args, ctx):
        """Linear regression on the fed columns; the chief exports a SavedModel."""
        import tensorflow as tf

        from tfcoord.compat.tensorflowonspark import TFNode

        feed = TFNode.DataFeed(ctx.mgr, input_mapping=args.input_mapping)
        w = tf.Variable(tf.zeros([2, 1]))
        while not feed.should_stop():
            batch = feed.next_batch(args.batch_size)
            if not batch["x"]:
                break
            x, y = tf.constant(batch["x"], tf.float32), tf.constant(batch["y_"], tf.float32)
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - y))
            w.assign_sub(0.5 * tape.gradient(loss, w))
        if ctx.job_name == "chief":
            module = tf.Module()
            module.w = w
            module.serve = tf.function(
                lambda features: {
                    "prediction": tf.matmul(features, module.w),
                    "squared": tf.matmul(features, module.w) ** 2,
                },
                input_signature=[tf.TensorSpec([None, 2], tf.float32, name="features")],
            )
            tf.saved_model.save(module, args.export_dir, signatures={"test_key": module.serve})

    import numpy as np

    rng = np.random.default_rng(1234)
    features = rng.random((2000, 2))
    labels = features @ np.array(WEIGHTS)
    train = spark.createDataFrame(
        [(f.tolist(), [float(y)]) for f, y in zip(features, labels, strict=True)], ["col1", "col2"]
    ).repartition(4)
    export = str(tmp_path / "export")
    est = (
        TFEstimator(train_fn, {"unused": 1})
        .setInputMapping({"col1": "x", "col2": "y_"})
        .setExportDir(export)
        .setClusterSize(2)
        .setBatchSize(10)
        .setEpochs(3)
        .setGraceSecs(60)
    )
    model = est.fit(train)
    assert os.path.isfile(os.path.join(export, "saved_model.pb"))
    assert model.getExportDir() == export and model.args.unused == 1

    test = spark.createDataFrame([([1.0, 1.0], [0.0]), ([2.0, 0.0], [0.0])] * 50, ["c1", "c2"]).repartition(6)
    model.setSignatureDefKey("test_key").setInputMapping({"c1": "features"})
    model.setOutputMapping({"prediction": "cout", "squared": "sq"}).setBatchSize(7)
    rows = model.transform(test).collect()
    assert len(rows) == 100 and set(rows[0].asDict()) == {"cout", "sq"}
    assert sorted({round(r.cout[0], 1) for r in rows}) == sorted(
        [round(2 * WEIGHTS[0], 1), round(sum(WEIGHTS), 1)]
    )
    assert all(r.sq[0] == pytest.approx(r.cout[0] ** 2, rel=1e-4) for r in rows)
    # Every Python worker that ran partitions loaded the model once: 6 partitions (and the
    # schema's sample), 2 executors.
    loads = sc.parallelize(range(8), 8).map(lambda _: pipeline.loads).collect()
    assert set(loads) <= {0, 1} and 1 in loads

    with pytest.raises(Exception, match="no signature 'nope'"):  # raised on the executors
        model.setSignatureDefKey("nope").transform(test).collect()
    with pytest.raises(ValueError, match="lacks"):
        est.setInputMapping({"nope": "x"}).fit(train)
