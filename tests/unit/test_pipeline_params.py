"""tensorflowonspark.pipeline's parameters and helpers, without a cluster: TensorFlowOnSpark 2.2.5's
names, defaults, setters and getters, Namespace and TFParams as its tests use them."""

from __future__ import annotations

import argparse

import pytest

pytest.importorskip("pyspark", reason="the Spark extra is not installed (pip install -e .[spark])")

from tfcoord.compat.tensorflowonspark import TFCluster
from tfcoord.compat.tensorflowonspark.pipeline import (
    HasBatchSize,
    HasSteps,
    Namespace,
    TFEstimator,
    TFModel,
    TFParams,
    yield_batch,
)

#: TensorFlowOnSpark 2.2.5's TFEstimator params and defaults.
ESTIMATOR_DEFAULTS = {
    "input_mapping": {},
    "cluster_size": 1,
    "num_ps": 0,
    "driver_ps_nodes": False,
    "input_mode": 1,
    "master_node": "chief",
    "protocol": "grpc",
    "tensorboard": False,
    "model_dir": None,
    "export_dir": None,
    "tfrecord_dir": None,
    "batch_size": 100,
    "epochs": 1,
    "readers": 1,
    "steps": 1000,
    "grace_secs": 30,
}
MODEL_DEFAULTS = {
    "input_mapping": {},
    "output_mapping": {},
    "batch_size": 100,
    "model_dir": None,
    "export_dir": None,
    "signature_def_key": None,
    "tag_set": None,
}
#: Each param's setter/getter suffix, as TensorFlowOnSpark spells them.
ACCESSORS = {
    "input_mapping": "InputMapping",
    "output_mapping": "OutputMapping",
    "cluster_size": "ClusterSize",
    "num_ps": "NumPS",
    "driver_ps_nodes": "DriverPSNodes",
    "input_mode": "InputMode",
    "master_node": "MasterNode",
    "protocol": "Protocol",
    "tensorboard": "Tensorboard",
    "model_dir": "ModelDir",
    "export_dir": "ExportDir",
    "tfrecord_dir": "TFRecordDir",
    "batch_size": "BatchSize",
    "epochs": "Epochs",
    "readers": "Readers",
    "steps": "Steps",
    "grace_secs": "GraceSecs",
    "signature_def_key": "SignatureDefKey",
    "tag_set": "TagSet",
}
SAMPLE = {
    "input_mapping": {"a": "x"},
    "output_mapping": {"y": "b"},
    "cluster_size": 3,
    "num_ps": 1,
    "driver_ps_nodes": True,
    "input_mode": 1,
    "master_node": "master",
    "protocol": "rdma",
    "tensorboard": True,
    "model_dir": "m",
    "export_dir": "e",
    "tfrecord_dir": "t",
    "batch_size": 7,
    "epochs": 4,
    "readers": 2,
    "steps": 9,
    "grace_secs": 60,
    "signature_def_key": "k",
    "tag_set": "serve",
}


def _noop(args, ctx):
    return None


@pytest.mark.parametrize(
    ("make", "defaults"),
    [(lambda: TFEstimator(_noop, {}), ESTIMATOR_DEFAULTS), (lambda: TFModel({}), MODEL_DEFAULTS)],
)
def test_every_param_has_tfos_name_default_setter_and_getter(make, defaults):
    stage = make()
    assert {p.name for p in stage.params} == set(defaults)
    for name, default in defaults.items():
        assert getattr(stage, f"get{ACCESSORS[name]}")() == default
        assert getattr(stage, f"set{ACCESSORS[name]}")(SAMPLE[name]) is stage  # chainable
        assert getattr(stage, f"get{ACCESSORS[name]}")() == SAMPLE[name]


def test_param_values_are_checked_when_set():
    est = TFEstimator(_noop, {})
    with pytest.raises(TypeError):
        est.setInputMapping(["image"])
    with pytest.raises(TypeError):
        est.setClusterSize("three")
    with pytest.raises(ValueError, match=r"only InputMode\.SPARK"):
        est.setInputMode(TFCluster.InputMode.TENSORFLOW)
    with pytest.raises(ValueError, match="export the SavedModel from train_fn"):
        TFEstimator(_noop, {}, export_fn=_noop)


def test_namespace_from_a_dict_a_namespace_argparse_and_argv():
    d = {"string": "foo", "integer": 1, "float": 3.14, "array": [1, 2, 3], "map": {"a": 1, "b": 2}}
    n1 = Namespace(d)
    assert (n1.string, n1.integer, n1.float, n1.array, n1.map) == tuple(d.values())
    assert "string" in n1 and "extra" not in n1
    n2 = Namespace(n1)
    assert n2 == n1 and "string" in n2 and "extra" not in n2
    n3 = Namespace(argparse.Namespace(a=1))
    assert n3.a == 1 and n3 == argparse.Namespace(a=1)
    argv = ["--foo", "1", "--bar", "test"]
    n4 = Namespace(argv)
    assert n4.argv == argv and n4 == argv and list(n4) == argv
    with pytest.raises(TypeError, match="Namespace takes a dict"):
        Namespace(42)


def test_tfparams_merge_args_with_params():
    class Foo(TFParams, HasBatchSize, HasSteps):
        def __init__(self, args):
            super().__init__()
            self.args = args

    n = Namespace({"a": 1, "b": 2})
    combined = Foo(n).setBatchSize(10).setSteps(100).merge_args_params()
    assert combined == Namespace({"a": 1, "b": 2, "batch_size": 10, "steps": 100})
    assert n == Namespace({"a": 1, "b": 2})  # the original args are left alone


def test_estimator_args_carry_params_to_train_fn():
    est = TFEstimator(_noop, {"lr": 0.1}).setInputMapping({"image": "image"}).setEpochs(3)
    args = est.merge_args_params()
    assert (args.lr, args.epochs, args.input_mapping, args.master_node) == (
        0.1,
        3,
        {"image": "image"},
        "chief",
    )
    model = est._copyValues(TFModel(est.args))
    assert model.getInputMapping() == {"image": "image"} and model.args.lr == 0.1


def test_yield_batch_groups_rows_column_wise():
    rows = [(i, -i) for i in range(5)]
    assert list(yield_batch(rows, 2, 2)) == [[[0, 1], [0, -1]], [[2, 3], [-2, -3]], [[4], [-4]]]
    assert list(yield_batch([(1,), None, (2,)], 10)) == [[[1]]]  # None ends the input
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        list(yield_batch(rows, 0))
