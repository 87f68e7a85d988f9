"""TensorFlowOnSpark's queue markers, for DataFeeds over a ``TFManager`` queue."""


class Marker:
    """Base class of the special items put into a queue beside the data."""


class EndPartition(Marker):
    """The end of one partition's records (inference batches never span two)."""


__all__ = ["EndPartition", "Marker"]
