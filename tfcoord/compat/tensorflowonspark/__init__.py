"""TensorFlowOnSpark's driver API on tfcoord: change the import, keep the code.

from tfcoord.compat.tensorflowonspark import TFCluster, TFParallel, TFNode

cluster = TFCluster.run(sc, main_fun, args, num_executors, num_ps,
                        input_mode=TFCluster.InputMode.TENSORFLOW)
cluster.shutdown()
"""

from tfcoord.driver.spark import InputMode

from . import TFCluster, TFManager, TFNode, TFParallel, TFSparkNode, compat, gpu_info, marker, util

__all__ = [
    "InputMode",
    "TFCluster",
    "TFManager",
    "TFNode",
    "TFParallel",
    "TFSparkNode",
    "compat",
    "gpu_info",
    "marker",
    "util",
]
