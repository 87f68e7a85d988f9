"""``tensorflowonspark.pipeline``: TensorFlow training and inference as Spark ML stages.

``TFEstimator(train_fn, tf_args).fit(df)`` starts a TensorFlow cluster with tfcoord's
``TFCluster.run`` in InputMode.SPARK, feeds it the DataFrame's ``input_mapping`` columns
(sorted by column name) for ``epochs`` epochs, shuts it down with ``grace_secs`` for the
chief to export its model, and returns a :class:`TFModel` carrying the same arguments
and parameters. ``train_fn(args, ctx)`` receives ``tf_args`` merged with the estimator's
parameters (``args.batch_size``, ``args.input_mapping``, ``args.export_dir``, ...), or the
argv list unchanged when ``tf_args`` is one.

``TFModel(tf_args).transform(df)`` runs single-node inference on every executor: each
Spark Python worker loads the SavedModel at ``export_dir`` once (a signature, by
``signature_def_key``, default ``serving_default``) and keeps it for the partitions it
runs next; rows go through it ``batch_size`` at a time. ``input_mapping`` maps DataFrame
columns to the signature's inputs (flat columns are reshaped to the input's shape and
cast to its dtype), ``output_mapping`` the signature's outputs to the result's columns.

Every parameter has TensorFlowOnSpark 2.2.5's name, default, setter and getter.
"""

from __future__ import annotations

import argparse
import copy
import logging
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from importlib import metadata
from typing import Any, TypeVar

from pyspark.ml import Estimator, Model
from pyspark.ml.param import Param, Params, TypeConverters

from tfcoord.node import keras2

from . import TFCluster, util

# The driver builds and exports Keras models here (TFModel, the examples' export): tf.keras as
# Keras 2 when tf-keras is installed, like the nodes TFCluster.run starts (TF_USE_LEGACY_KERAS=0 opts out).
if keras2.use_keras2(os.environ):
    keras2.honour_lr()


log = logging.getLogger("tfcoord.compat.pipeline")


def _tf_version() -> str | None:
    for dist in ("tensorflow", "tensorflow-cpu", "tensorflow-gpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


#: The installed TensorFlow's version (TensorFlowOnSpark's module constant); None without one.
TF_VERSION = _tf_version()
#: The SavedModel signature a TFModel runs when ``signature_def_key`` is not set.
DEFAULT_SIGNATURE = "serving_default"


class TFTypeConverters:
    """Param type converters Spark does not have."""

    @staticmethod
    def toDict(value: Any) -> dict[Any, Any]:
        if isinstance(value, dict):
            return value
        raise TypeError(f"Could not convert {value!r} to a dict: give a {{column: tensor}} mapping")


_T = TypeVar("_T")


def _param(name: str, doc: str, converter: Callable[[Any], _T]) -> Param[_T]:
    return Param(Params._dummy(), name, doc, typeConverter=converter)


# -- the parameters, one mix-in each (TensorFlowOnSpark's classes and names) ---------------


class HasBatchSize(Params):
    batch_size = _param("batch_size", "Number of records per batch", TypeConverters.toInt)

    def setBatchSize(self, value: int) -> Any:
        return self._set(batch_size=value)

    def getBatchSize(self) -> int:
        return self.getOrDefault(self.batch_size)


class HasClusterSize(Params):
    cluster_size = _param("cluster_size", "Number of nodes in the cluster", TypeConverters.toInt)

    def setClusterSize(self, value: int) -> Any:
        return self._set(cluster_size=value)

    def getClusterSize(self) -> int:
        return self.getOrDefault(self.cluster_size)


class HasEpochs(Params):
    epochs = _param("epochs", "Number of epochs to train", TypeConverters.toInt)

    def setEpochs(self, value: int) -> Any:
        return self._set(epochs=value)

    def getEpochs(self) -> int:
        return self.getOrDefault(self.epochs)


class HasGraceSecs(Params):
    grace_secs = _param(
        "grace_secs",
        "Number of seconds to wait after feeding data (for final tasks like exporting a saved_model)",
        TypeConverters.toInt,
    )

    def setGraceSecs(self, value: int) -> Any:
        return self._set(grace_secs=value)

    def getGraceSecs(self) -> int:
        return self.getOrDefault(self.grace_secs)


class HasInputMapping(Params):
    input_mapping = _param(
        "input_mapping", "Mapping of input DataFrame column to input tensor", TFTypeConverters.toDict
    )

    def setInputMapping(self, value: dict[str, str]) -> Any:
        return self._set(input_mapping=value)

    def getInputMapping(self) -> dict[str, str]:
        return self.getOrDefault(self.input_mapping)


class HasInputMode(Params):
    input_mode = _param("input_mode", "Input data feeding mode (0=TENSORFLOW, 1=SPARK)", TypeConverters.toInt)

    def setInputMode(self, value: int) -> Any:
        if value != TFCluster.InputMode.SPARK:
            # As in TensorFlowOnSpark 2.x: a DataFrame is fed by Spark, or not at all.
            raise ValueError(
                "TFEstimator supports only InputMode.SPARK (InputMode.TENSORFLOW is deprecated: "
                "read the data in the TensorFlow code and use TFCluster.run directly)"
            )
        return self._set(input_mode=value)

    def getInputMode(self) -> int:
        return self.getOrDefault(self.input_mode)


class HasMasterNode(Params):
    master_node = _param("master_node", "Job name of master/chief worker node", TypeConverters.toString)

    def setMasterNode(self, value: str | None) -> Any:
        return self._set(master_node=value)

    def getMasterNode(self) -> str | None:
        return self.getOrDefault(self.master_node)


class HasModelDir(Params):
    model_dir = _param("model_dir", "Path to save/load model checkpoints", TypeConverters.toString)

    def setModelDir(self, value: str | None) -> Any:
        return self._set(model_dir=value)

    def getModelDir(self) -> str | None:
        return self.getOrDefault(self.model_dir)


class HasNumPS(Params):
    num_ps = _param("num_ps", "Number of PS nodes in cluster", TypeConverters.toInt)
    driver_ps_nodes = _param("driver_ps_nodes", "Run PS nodes on driver locally", TypeConverters.toBoolean)

    def setNumPS(self, value: int) -> Any:
        return self._set(num_ps=value)

    def getNumPS(self) -> int:
        return self.getOrDefault(self.num_ps)

    def setDriverPSNodes(self, value: bool) -> Any:
        return self._set(driver_ps_nodes=value)

    def getDriverPSNodes(self) -> bool:
        return self.getOrDefault(self.driver_ps_nodes)


class HasOutputMapping(Params):
    output_mapping = _param(
        "output_mapping", "Mapping of output tensor to output DataFrame column", TFTypeConverters.toDict
    )

    def setOutputMapping(self, value: dict[str, str]) -> Any:
        return self._set(output_mapping=value)

    def getOutputMapping(self) -> dict[str, str]:
        return self.getOrDefault(self.output_mapping)


class HasProtocol(Params):
    protocol = _param("protocol", "Network protocol for Tensorflow (grpc|rdma)", TypeConverters.toString)

    def setProtocol(self, value: str) -> Any:
        return self._set(protocol=value)

    def getProtocol(self) -> str:
        return self.getOrDefault(self.protocol)


class HasReaders(Params):
    readers = _param("readers", "number of reader/enqueue threads", TypeConverters.toInt)

    def setReaders(self, value: int) -> Any:
        return self._set(readers=value)

    def getReaders(self) -> int:
        return self.getOrDefault(self.readers)


class HasSteps(Params):
    steps = _param("steps", "Maximum number of steps to train", TypeConverters.toInt)

    def setSteps(self, value: int) -> Any:
        return self._set(steps=value)

    def getSteps(self) -> int:
        return self.getOrDefault(self.steps)


class HasTensorboard(Params):
    tensorboard = _param("tensorboard", "Launch tensorboard process", TypeConverters.toBoolean)

    def setTensorboard(self, value: bool) -> Any:
        return self._set(tensorboard=value)

    def getTensorboard(self) -> bool:
        return self.getOrDefault(self.tensorboard)


class HasTFRecordDir(Params):
    tfrecord_dir = _param(
        "tfrecord_dir",
        "Path to temporarily export a DataFrame as TFRecords (for InputMode.TENSORFLOW apps)",
        TypeConverters.toString,
    )

    def setTFRecordDir(self, value: str | None) -> Any:
        return self._set(tfrecord_dir=value)

    def getTFRecordDir(self) -> str | None:
        return self.getOrDefault(self.tfrecord_dir)


class HasExportDir(Params):
    export_dir = _param("export_dir", "Directory to export saved_model", TypeConverters.toString)

    def setExportDir(self, value: str | None) -> Any:
        return self._set(export_dir=value)

    def getExportDir(self) -> str | None:
        return self.getOrDefault(self.export_dir)


class HasSignatureDefKey(Params):
    signature_def_key = _param(
        "signature_def_key", "Identifier for a specific saved_model signature", TypeConverters.toString
    )

    def __init__(self) -> None:
        super().__init__()
        self._setDefault(signature_def_key=None)

    def setSignatureDefKey(self, value: str | None) -> Any:
        return self._set(signature_def_key=value)

    def getSignatureDefKey(self) -> str | None:
        return self.getOrDefault(self.signature_def_key)


class HasTagSet(Params):
    tag_set = _param(
        "tag_set", "Comma-delimited list of tags identifying a saved_model metagraph", TypeConverters.toString
    )

    def setTagSet(self, value: str | None) -> Any:
        return self._set(tag_set=value)

    def getTagSet(self) -> str | None:
        return self.getOrDefault(self.tag_set)


class Namespace:
    """Attribute access over a dict, an ``argparse.Namespace`` or another Namespace; or an argv list.

    ``key in ns`` and ``iter(ns)`` go over the attribute names (over the argv items for
    a list); a Namespace made from a list keeps it as ``argv``.
    """

    argv: list[str] | None = None

    def __init__(self, d: Any) -> None:
        if isinstance(d, list):
            self.argv = d
        elif isinstance(d, dict):
            self.__dict__.update(d)
        elif isinstance(d, (argparse.Namespace, Namespace)):
            self.__dict__.update(vars(d))
        else:
            raise TypeError(
                f"Namespace takes a dict, a list of arguments, an argparse.Namespace or a "
                f"Namespace, not {type(d).__name__}"
            )

    def __iter__(self) -> Iterator[Any]:
        return iter(self.argv) if self.argv else iter(list(self.__dict__))

    def __repr__(self) -> str:
        if self.argv:
            return repr(self.argv)
        return f"Namespace({', '.join(f'{k}={v!r}' for k, v in sorted(self.__dict__.items()))})"

    def __eq__(self, other: object) -> bool:
        if self.argv:
            return self.argv == other
        return isinstance(other, (Namespace, argparse.Namespace)) and self.__dict__ == vars(other)

    __hash__ = None  # type: ignore[assignment]  # mutable, compared by value


class TFParams(Params):
    """Mix-in: namespace-style ``args`` merged with the Spark ML params."""

    args: Any = None

    def merge_args_params(self) -> Any:
        """A copy of ``args`` with every param's current value (set or default) as an attribute."""
        merged = copy.copy(self.args)
        values = vars(merged)
        for p in self.params:
            values[p.name] = self.getOrDefault(p.name)
        return merged


class TFEstimator(
    Estimator["TFModel"],
    TFParams,
    HasInputMapping,
    HasClusterSize,
    HasNumPS,
    HasInputMode,
    HasMasterNode,
    HasProtocol,
    HasGraceSecs,
    HasTensorboard,
    HasModelDir,
    HasExportDir,
    HasTFRecordDir,
    HasBatchSize,
    HasEpochs,
    HasReaders,
    HasSteps,
):
    """Spark ML Estimator: distributed training on a tfcoord TensorFlow cluster, fed from the DataFrame.

    Args:
        train_fn: the nodes' ``main_fun(args, ctx)``.
        tf_args: its arguments (a dict, an ``argparse.Namespace`` or an argv list).
        export_fn: TensorFlow 1's separate export function; not supported under
            TensorFlow 2 (export the SavedModel from ``train_fn``, e.g. with
            ``compat.export_saved_model``).
    """

    train_fn: Any = None
    export_fn: Any = None

    def __init__(self, train_fn: Any, tf_args: Any, export_fn: Any = None) -> None:
        super().__init__()
        if export_fn is not None:
            raise ValueError(
                "export_fn is TensorFlow 1's: under TensorFlow 2 export the SavedModel from "
                "train_fn (compat.export_saved_model(model, args.export_dir, ctx.job_name == 'chief'))"
            )
        self.train_fn = train_fn
        self.args = Namespace(tf_args)
        self._setDefault(
            input_mapping={},
            cluster_size=1,
            num_ps=0,
            driver_ps_nodes=False,
            input_mode=TFCluster.InputMode.SPARK,
            master_node="chief",
            protocol="grpc",
            tensorboard=False,
            model_dir=None,
            export_dir=None,
            tfrecord_dir=None,
            batch_size=100,
            epochs=1,
            readers=1,
            steps=1000,
            grace_secs=30,
        )

    def _fit(self, dataset: Any) -> TFModel:
        """Train on ``dataset`` and return a TFModel with the same args and params.

        Raises:
            ValueError: no ``input_mapping`` (nothing to feed), or a mapped column that
                ``dataset`` does not have.
            tfcoord.client.JobFailed: a node failed (the message carries its traceback).
        """
        from pyspark import SparkContext

        mapping = self.getInputMapping()
        if not mapping:
            raise ValueError("TFEstimator needs setInputMapping({column: tensor, ...}): the columns to feed")
        missing = sorted(set(mapping) - set(dataset.columns))
        if missing:
            raise ValueError(
                f"input_mapping names column(s) {missing} that the DataFrame lacks (it has {dataset.columns})"
            )
        sc = SparkContext.getOrCreate()
        local_args = self.merge_args_params()
        log.info("training with args %s", local_args)
        tf_args = self.args.argv if self.args.argv else local_args
        cluster = TFCluster.run(
            sc,
            self.train_fn,
            tf_args,
            local_args.cluster_size,
            local_args.num_ps,
            local_args.tensorboard,
            TFCluster.InputMode.SPARK,
            master_node=local_args.master_node,
            driver_ps_nodes=local_args.driver_ps_nodes,
        )
        try:
            # Columns in a fixed order, sorted by name: DataFeed(input_mapping=...) reads them so.
            cluster.train(dataset.select(sorted(mapping)).rdd, local_args.epochs)
        except BaseException:
            cluster._abort("TFEstimator.fit: feeding failed")
            raise
        cluster.shutdown(grace_secs=self.getGraceSecs())
        return self._copyValues(TFModel(self.args))


class TFModel(
    Model,
    TFParams,
    HasInputMapping,
    HasOutputMapping,
    HasBatchSize,
    HasModelDir,
    HasExportDir,
    HasSignatureDefKey,
    HasTagSet,
):
    """Spark ML Model: single-node inference from a SavedModel on every executor, in parallel.

    The model must fit in an executor's memory. Each Spark Python worker loads it once
    and keeps it for later partitions and later ``transform`` calls with the same
    arguments.

    Args:
        tf_args: arguments for the inference (a dict, an ``argparse.Namespace`` or an
            argv list); ``num_gpus`` among them picks GPUs as TFCluster nodes do.
    """

    def __init__(self, tf_args: Any) -> None:
        super().__init__()
        self.args = Namespace(tf_args)
        self._setDefault(
            input_mapping={},
            output_mapping={},
            batch_size=100,
            model_dir=None,
            export_dir=None,
            signature_def_key=None,
            tag_set=None,
        )

    def _transform(self, dataset: Any) -> Any:
        """A DataFrame of the ``output_mapping`` columns, one row per input row, in order.

        Raises:
            ValueError: no export_dir, no input or output mapping, or a mapped column
                that ``dataset`` lacks.
        """
        from pyspark.sql import SparkSession

        in_map, out_map = self.getInputMapping(), self.getOutputMapping()
        if not self.getExportDir():
            raise ValueError(
                "TFModel needs setExportDir(path of a SavedModel): TensorFlow 2 infers from "
                "SavedModels, not checkpoints"
            )
        if not in_map or not out_map:
            raise ValueError(
                "TFModel needs setInputMapping({column: input}) and setOutputMapping({output: column})"
            )
        missing = sorted(set(in_map) - set(dataset.columns))
        if missing:
            raise ValueError(
                f"input_mapping names column(s) {missing} that the DataFrame lacks (it has {dataset.columns})"
            )
        input_cols = sorted(in_map)
        output_cols = [out_map[t] for t in sorted(out_map)]
        local_args = self.merge_args_params()
        tf_args = self.args.argv if self.args.argv else local_args
        rows = dataset.select(input_cols).rdd.mapPartitions(lambda it: _run_model(it, local_args, tf_args))
        spark = SparkSession.builder.getOrCreate()
        return spark.createDataFrame(rows, output_cols)


# -- inference on the executors --------------------------------------------------------

#: This Python worker's loaded model: (key of the arguments it was loaded for, the
#: SavedModel object, the signature function). Spark reuses Python workers across tasks,
#: so later partitions skip the load.
_cache: tuple[Any, Any, Any] | None = None
#: How many times this process loaded a model (read by tests and the curious).
loads = 0


def _model_key(args: Any) -> tuple[Any, ...]:
    return (args.export_dir, args.tag_set, args.signature_def_key or DEFAULT_SIGNATURE)


def _signature(args: Any) -> Any:
    """The signature to run for ``args``, loaded once per process per model."""
    global _cache, loads
    key = _model_key(args)
    if _cache is None or _cache[0] != key:
        import tensorflow as tf

        tags = args.tag_set.split(",") if args.tag_set else None
        log.info("loading SavedModel %s (tags %s)", args.export_dir, tags)
        model = tf.saved_model.load(args.export_dir, tags=tags)
        name = args.signature_def_key or DEFAULT_SIGNATURE
        if name not in model.signatures:
            raise ValueError(
                f"the SavedModel at {args.export_dir} has no signature {name!r} "
                f"(it has {sorted(model.signatures)}): fix setSignatureDefKey"
            )
        _cache = (key, model, model.signatures[name])
        loads += 1
    return _cache[2]


def _run_model(rows: Iterable[Any], args: Any, tf_args: Any) -> Iterator[tuple[Any, ...]]:
    """mapPartitions: run every row's inputs through the signature, ``batch_size`` rows per call."""
    if _cache is None or _cache[0] != _model_key(args):
        single_node_env(tf_args)  # before TensorFlow starts in this process: GPUs, CLASSPATH
    import numpy as np
    import tensorflow as tf

    signature = _signature(args)
    inputs = [args.input_mapping[c] for c in sorted(args.input_mapping)]
    outputs = sorted(args.output_mapping)
    specs = signature.structured_input_signature[1]
    unknown = [t for t in inputs if t not in specs]
    if unknown:
        raise ValueError(
            f"input_mapping names input(s) {unknown} that signature "
            f"{args.signature_def_key or DEFAULT_SIGNATURE!r} lacks (it has {sorted(specs)})"
        )
    for columns in yield_batch(rows, args.batch_size, len(inputs)):
        feed = {}
        for name, values in zip(inputs, columns, strict=True):
            spec = specs[name]
            tensor = tf.constant(np.asarray(values), dtype=spec.dtype)
            # Spark columns are flat arrays; a SavedModel does not say how its caller
            # shaped the data, so fit each row to the input's shape (e.g. 784 -> 28x28x1).
            shape = [len(values), *(-1 if d is None else d for d in spec.shape[1:])]
            if tensor.shape.as_list() != shape:
                tensor = tf.reshape(tensor, shape)
            feed[name] = tensor
        result = signature(**feed)
        missing = [t for t in outputs if t not in result]
        if missing:
            raise ValueError(
                f"output_mapping names output(s) {missing} that the signature lacks (it has {sorted(result)})"
            )
        columns_out = [result[t].numpy().tolist() for t in outputs]
        if any(len(c) != len(columns[0]) for c in columns_out):
            raise ValueError(
                f"the signature returned {[len(c) for c in columns_out]} rows for "
                f"{len(columns[0])} inputs: every output must have one row per input"
            )
        yield from zip(*columns_out, strict=True)


def single_node_env(args: Any) -> None:
    """Set up this process for single-node TensorFlow: ``sys.argv`` for an argv list, GPUs, CLASSPATH."""
    if isinstance(args, list):
        sys.argv = args
    elif getattr(args, "argv", None):
        sys.argv = args.argv
    num_gpus = args.num_gpus if not isinstance(args, list) and "num_gpus" in args else 1
    util.single_node_env(num_gpus)


def get_meta_graph_def(saved_model_dir: str, tag_set: str) -> Any:
    """The MetaGraphDef of the SavedModel at ``saved_model_dir`` whose tags are ``tag_set`` (comma-separated).

    Raises:
        RuntimeError: no meta graph has exactly those tags.
    """
    from tensorflow.python.saved_model import loader_impl

    wanted = set(tag_set.split(","))
    for meta_graph_def in loader_impl.parse_saved_model(saved_model_dir).meta_graphs:
        if set(meta_graph_def.meta_info_def.tags) == wanted:
            return meta_graph_def
    raise RuntimeError(f"the SavedModel at {saved_model_dir} has no MetaGraphDef with tags {tag_set!r}")


def yield_batch(iterable: Iterable[Any], batch_size: int, num_tensors: int = 1) -> Iterator[list[list[Any]]]:
    """Column-wise batches of ``batch_size`` rows: ``num_tensors`` lists, one per column.

    A ``None`` row ends the input (TensorFlowOnSpark's end marker); the last batch may be short.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, not {batch_size}")
    columns: list[list[Any]] = [[] for _ in range(num_tensors)]
    for item in iterable:
        if item is None:
            break
        for i in range(num_tensors):
            columns[i].append(item[i])
        if len(columns[0]) >= batch_size:
            yield columns
            columns = [[] for _ in range(num_tensors)]
    if columns[0]:
        yield columns


__all__ = [
    "HasBatchSize",
    "HasClusterSize",
    "HasEpochs",
    "HasExportDir",
    "HasGraceSecs",
    "HasInputMapping",
    "HasInputMode",
    "HasMasterNode",
    "HasModelDir",
    "HasNumPS",
    "HasOutputMapping",
    "HasProtocol",
    "HasReaders",
    "HasSignatureDefKey",
    "HasSteps",
    "HasTFRecordDir",
    "HasTagSet",
    "HasTensorboard",
    "Namespace",
    "TFEstimator",
    "TFModel",
    "TFParams",
    "TFTypeConverters",
    "get_meta_graph_def",
    "single_node_env",
    "yield_batch",
]
