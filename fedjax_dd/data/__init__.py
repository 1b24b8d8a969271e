"""Data: loaders, preprocessing, client partitions and padded client stacks."""

from fedjax_dd.data.partition import class_counts
from fedjax_dd.data.partition import dirichlet
from fedjax_dd.data.partition import disjoint_classes
from fedjax_dd.data.partition import iid
from fedjax_dd.data.partition import pathological
from fedjax_dd.data.partition import quantity_skew
from fedjax_dd.data.preprocess import channel_stats
from fedjax_dd.data.preprocess import normalize
from fedjax_dd.data.preprocess import resize_images
from fedjax_dd.data.sources import Dataset
from fedjax_dd.data.sources import load_dataset
from fedjax_dd.data.sources import load_unlabeled
from fedjax_dd.data.stacked import ClientData
from fedjax_dd.data.stacked import sample_batch
from fedjax_dd.data.stacked import stack_clients

__all__ = [
    "ClientData",
    "Dataset",
    "channel_stats",
    "class_counts",
    "dirichlet",
    "disjoint_classes",
    "iid",
    "load_dataset",
    "load_unlabeled",
    "normalize",
    "pathological",
    "quantity_skew",
    "resize_images",
    "sample_batch",
    "stack_clients",
]
