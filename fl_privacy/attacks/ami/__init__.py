"""Active membership inference (AMI) by a dishonest FL server, with and without LDP.

Nguyen et al., "Active Membership Inference Attack under Local Differential Privacy in
Federated Learning" (AISTATS 2023), called "the AMI paper" below.

The server crafts the first fully connected layer W (r neurons over the d-dim features) and one
neuron h of the second layer so that the chosen neuron's pre-activation
v(x) = h . ReLU(W x + b) + c is positive on the target (under LDP: on randomized copies of it)
and non-positive on everything else (Eqs. 5-7). A client's gradient of the chosen neuron is then
non-zero iff some row of its (randomized) batch activates the neuron, and the server decides
"member" iff that gradient is non-zero (Figs. 2 and 4).

This package holds
- crafting (`init_neuron`, `chosen_value`, `crafting_loss`, `craft`, `craft_many`), a sound
  replacement of the public code's sigmoid-then-cross-entropy loss by class-weighted binary
  cross-entropy on logits, full-batch Adam, stopping at 100% training separation;
- `rescale` (positive homogeneity: powers of two, decisions unchanged bit for bit) and
  `write_into_mlp`, which places the crafted block into a real Flax `models.MLP`;
- the decision, on two paths: `decide_from_gradient` (literal: `jax.grad` of the MLP's
  cross-entropy, read the chosen neuron's gradient) and `decide_from_activation` (fast: some
  row has v > 0);
- (in `fl_privacy.mechanisms.codes`) a fast LDP sampler over fixed-point codes (`CodeChannel`), which draws a whole group of up to
  5 output bits from one 32-bit word by inverse CDF instead of one Bernoulli per bit (every
  output code's probability within 2**-32 of the mechanism's, 1.5 * 2**-32 next to a CDF capped
  at the largest uint32 threshold; the exact total-variation
  distance is computed and reported);
- the security game's trials (Figs. 1 and 3) for `eval.runner.run_trials` (`game`);
- the certified guarantee (`certified`, Eqs. 9-10) and DP-SGD noise averaging (`dp_averaging`).

Modules: `crafting`, `decisions`, `game`, `certified`, `dp_averaging`, `point` (one point of
the experiment: craft, play, certify, utility). The names below are
re-exported so that `ami.craft`, `ami.fast_trial`, ... read as one API.
"""

from fl_privacy.attacks.ami import certified
from fl_privacy.attacks.ami import crafting
from fl_privacy.attacks.ami import decisions
from fl_privacy.attacks.ami import dp_averaging
from fl_privacy.attacks.ami import game
from fl_privacy.attacks.ami import point
from fl_privacy.attacks.ami.crafting import CraftedNeuron
from fl_privacy.attacks.ami.crafting import CraftReport
from fl_privacy.attacks.ami.crafting import init_neuron
from fl_privacy.attacks.ami.crafting import chosen_value
from fl_privacy.attacks.ami.crafting import crafting_loss
from fl_privacy.attacks.ami.crafting import balanced_class_weights
from fl_privacy.attacks.ami.crafting import craft
from fl_privacy.attacks.ami.crafting import craft_many
from fl_privacy.attacks.ami.crafting import rescale
from fl_privacy.attacks.ami.crafting import batch_advantage
from fl_privacy.attacks.ami.crafting import calibrate_bias
from fl_privacy.attacks.ami.decisions import FC1
from fl_privacy.attacks.ami.decisions import FC2
from fl_privacy.attacks.ami.decisions import write_into_mlp
from fl_privacy.attacks.ami.decisions import chosen_gradient
from fl_privacy.attacks.ami.decisions import decide_from_gradient
from fl_privacy.attacks.ami.decisions import decide_from_activation
from fl_privacy.attacks.ami.game import GameSide
from fl_privacy.attacks.ami.game import trial_roles
from fl_privacy.attacks.ami.game import trial_batch
from fl_privacy.attacks.ami.game import randomize_key
from fl_privacy.attacks.ami.game import defense_key
from fl_privacy.attacks.ami.game import apply_defense
from fl_privacy.attacks.ami.game import fast_trial
from fl_privacy.attacks.ami.game import fast_trial_pair
from fl_privacy.attacks.ami.game import precomputed_values
from fl_privacy.attacks.ami.game import fast_trial_no_ldp
from fl_privacy.attacks.ami.game import neuron_from_params
from fl_privacy.attacks.ami.game import literal_trial
from fl_privacy.attacks.ami.game import game_rates
from fl_privacy.mechanisms.codes import DEFAULT_GROUP_SIZE
from fl_privacy.mechanisms.codes import MECHANISMS
from fl_privacy.mechanisms.codes import Encoding
from fl_privacy.mechanisms.codes import pack_codes
from fl_privacy.mechanisms.codes import unpack_codes
from fl_privacy.mechanisms.codes import codes_to_values
from fl_privacy.mechanisms.codes import CodeChannel
from fl_privacy.mechanisms.codes import channel_from_bit_probs
from fl_privacy.mechanisms.codes import bit_probabilities
from fl_privacy.mechanisms.codes import mechanism_fn
from fl_privacy.mechanisms.codes import sample_codes

__all__ = [
    'CodeChannel',
    'CraftReport',
    'CraftedNeuron',
    'DEFAULT_GROUP_SIZE',
    'Encoding',
    'FC1',
    'FC2',
    'apply_defense',
    'defense_key',
    'GameSide',
    'MECHANISMS',
    'balanced_class_weights',
    'batch_advantage',
    'bit_probabilities',
    'calibrate_bias',
    'certified',
    'channel_from_bit_probs',
    'chosen_gradient',
    'chosen_value',
    'codes_to_values',
    'craft',
    'craft_many',
    'crafting',
    'crafting_loss',
    'decide_from_activation',
    'decide_from_gradient',
    'decisions',
    'dp_averaging',
    'fast_trial',
    'fast_trial_pair',
    'fast_trial_no_ldp',
    'game',
    'point',
    'game_rates',
    'init_neuron',
    'literal_trial',
    'mechanism_fn',
    'neuron_from_params',
    'pack_codes',
    'precomputed_values',
    'randomize_key',
    'rescale',
    'sample_codes',
    'trial_batch',
    'trial_roles',
    'unpack_codes',
    'write_into_mlp',
]
