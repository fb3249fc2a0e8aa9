"""Flax models and helpers that craft their parameters."""

from fl_privacy.models import crafting
from fl_privacy.models.alexnet import AlexNetCifar
from fl_privacy.models.cnn import AuditCNN
from fl_privacy.models.cnn import FlowerCNN
from fl_privacy.models.crafting import param_count
from fl_privacy.models.crafting import read_neuron
from fl_privacy.models.crafting import write_layer
from fl_privacy.models.crafting import write_neuron
from fl_privacy.models.factory import MODELS
from fl_privacy.models.factory import make
from fl_privacy.models.mlp import MLP
from fl_privacy.models.resnet import ResNet18GN

__all__ = [
    'AlexNetCifar', 'AuditCNN', 'FlowerCNN', 'MLP', 'MODELS', 'ResNet18GN',
    'crafting', 'make', 'param_count', 'read_neuron', 'write_layer',
    'write_neuron',
]
