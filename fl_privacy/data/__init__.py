"""Data layer: datasets as numpy arrays, splits, client partitions, features, duplicates."""

from fl_privacy.data import duplicates
from fl_privacy.data import extractors
from fl_privacy.data import features
from fl_privacy.data.dataset import Dataset
from fl_privacy.data.dataset import DataUnavailableError
from fl_privacy.data.dataset import rng_from_key
from fl_privacy.data.dataset import to_float
from fl_privacy.data.loading import DATASETS
from fl_privacy.data.local_sources import DataFileError
from fl_privacy.data.loading import load
from fl_privacy.data.loading import require_examples
from fl_privacy.data.loading import validate_data_config
from fl_privacy.data.partitions import beta_partition
from fl_privacy.data.partitions import dirichlet_partition
from fl_privacy.data.partitions import holdout_split
from fl_privacy.data.partitions import iid_partition
from fl_privacy.data.partitions import member_nonmember_split

__all__ = [
    'DATASETS',
    'DataFileError',
    'DataUnavailableError',
    'Dataset',
    'dirichlet_partition',
    'duplicates',
    'extractors',
    'features',
    'holdout_split',
    'iid_partition',
    'load',
    'member_nonmember_split',
    'require_examples',
    'rng_from_key',
    'to_float',
    'validate_data_config',
]
