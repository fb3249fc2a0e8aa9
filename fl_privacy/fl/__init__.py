"""Pure federated-learning pieces: losses, gradients, the client protocol, local training, rounds."""

from fl_privacy.fl import aggregate
from fl_privacy.fl import client
from fl_privacy.fl import grads
from fl_privacy.fl import local
from fl_privacy.fl import losses
from fl_privacy.fl import optimizers
from fl_privacy.fl import rounds
from fl_privacy.fl import sampling
from fl_privacy.fl.client import ClientHooks
from fl_privacy.fl.grads import client_grads
from fl_privacy.fl.grads import per_example_grads
from fl_privacy.fl.local import client_update
from fl_privacy.fl.local import fedavg
from fl_privacy.fl.local import fedsgd
from fl_privacy.fl.losses import cross_entropy
from fl_privacy.fl.losses import make_loss_fn
from fl_privacy.fl.losses import per_example_cross_entropy
from fl_privacy.fl.optimizers import OPTIMIZERS

__all__ = [
    'ClientHooks', 'OPTIMIZERS', 'aggregate', 'client', 'client_grads', 'client_update', 'cross_entropy', 'fedavg',
    'fedsgd', 'grads', 'local', 'losses', 'make_loss_fn', 'optimizers',
    'per_example_cross_entropy', 'per_example_grads', 'rounds', 'sampling',
]
