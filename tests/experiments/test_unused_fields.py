"""Fields a run does not read are declared (`unused_fields`), so that `experiments.common`
refuses a command-line override of one instead of recording a value that did not run (in
process; the refusal's exit status and line are test_bad_inputs' rows)."""

from __future__ import annotations

import ml_collections
import pytest

from configs import digits
from configs import toy
from experiments import common
from fl_privacy import catalog
from fl_privacy import defenses
from fl_privacy.pipelines import ami
from fl_privacy.pipelines import base
from fl_privacy.pipelines import dishonest_mia
from fl_privacy.pipelines import duplicates
from fl_privacy.pipelines import pastel


def test_ami_reads_the_ldp_fields_only_under_an_ldp_mechanism():
  config = digits.get_config()
  ldp = {'ami.epsilons', 'ami.copies', 'ami.randomize_negatives', 'ami.ldp_sign_bit',
         'ami.int_bits', 'ami.frac_bits', 'ami.certified_draws', 'ami.certified_delta',
         'ami.certified_samples'}
  assert not ldp & set(base.unused(ami, config))
  config.ami.mechanisms = ('none',)
  unused = base.unused(ami, config)
  assert ldp <= set(unused) and 'LDP mechanism' in unused['ami.epsilons']
  config.ami.mechanisms = ('none', 'ome')
  assert not ldp & set(ami.unused_fields(config))
  # Balanced class weights ignore the explicit ones; a non-identity extractor its scale.
  config.ami.balanced_class_weights = True
  assert 'ami.class_weights' in ami.unused_fields(config)
  config.ami.balanced_class_weights = False
  assert 'ami.class_weights' not in ami.unused_fields(config)
  assert 'ami.feature_scale' not in ami.unused_fields(config)
  config.ami.extractor = 'resnet18'
  assert "'identity'" in ami.unused_fields(config)['ami.feature_scale']


def test_dishonest_and_duplicates_split_their_shared_section():
  config = digits.get_config()
  unused = dishonest_mia.unused_fields(config)
  assert set(unused) == {'dishonest.duplicate_splits', 'dishonest.near_threshold'}
  config.dishonest.grid = 'product'
  config.dishonest.optimizers = ('adam',)
  unused = dishonest_mia.unused_fields(config)
  assert {'dishonest.center.M', 'dishonest.center.num_batches', 'dishonest.center.epochs',
          'dishonest.momentum'} <= set(unused)
  searched = duplicates.unused_fields(config)
  assert 'dishonest.duplicate_splits' not in searched
  assert 'dishonest.near_threshold' not in searched
  assert {'dishonest.runs', 'dishonest.center.M', 'dishonest.momentum'} <= set(searched)


def test_pastel_declares_what_its_trainings_do_not_read():
  config = digits.get_config()
  assert pastel.unused_fields(config) == {}   # the default reads every field
  s = config.pastel
  s.defenses = ('none',)
  s.attacks = ('loss_threshold',)
  unused = pastel.unused_fields(config)
  assert {'pastel.pastel_weights', 'pastel.epsilons', 'pastel.dp_delta', 'pastel.clip_norm',
          'pastel.ldp_sampling', 'pastel.update_clip_norm', 'pastel.attack_steps',
          'pastel.attack_hidden', 'pastel.attack_learning_rate',
          'pastel.attack_per_replicate'} == set(unused)
  # The JS-gap diagnostic of every training reads the layers, the first reading and (for
  # 'activation') the temperature; the ablation reads its own settings.
  s.pastel_representations = ('gradient',)
  assert 'pastel.pastel_temperature' in pastel.unused_fields(config)
  s.ablation_optimizer = 'none'
  assert {'pastel.ablation_learning_rate', 'pastel.ablation_pastel_weight'} <= set(
      pastel.unused_fields(config))
  s.defenses = ('cdp',)
  unused = pastel.unused_fields(config)
  assert 'pastel.epsilons' not in unused and 'pastel.update_clip_norm' not in unused
  assert 'pastel.clip_norm' in unused
  s.model = 'resnet18_gn'
  assert "'mlp'" in pastel.unused_fields(config)['pastel.mlp_hidden']


def test_dp_audit_declares_the_fields_no_audited_mechanism_reads():
  from fl_privacy.pipelines import dp_audit  # pylint: disable=g-import-not-at-top
  config = digits.get_config()
  assert dp_audit.unused_fields(config) == {}
  config.dp_audit.mechanisms = ('central_dp',)
  unused = dp_audit.unused_fields(config)
  assert set(unused) == {'dp_audit.num_examples', 'dp_audit.batch_size', 'dp_audit.epochs',
                         'dp_audit.ldp_reports'}
  assert 'dp_sgd_poisson or dp_sgd_shuffle' in unused['dp_audit.epochs']
  config.dp_audit.mechanisms = ('dp_sgd_shuffle', 'ldp_sgd')
  assert set(dp_audit.unused_fields(config)) == {'dp_audit.rounds', 'dp_audit.num_clients'}


def test_flower_audit_declares_the_parts_it_does_not_run():
  from fl_privacy.flower.parts import pipeline  # pylint: disable=g-import-not-at-top
  config = digits.get_config()
  s = config.flower_audit
  unused = pipeline.unused_fields(config)
  # The default: the four default parts; reconstruction is opt-in; the model is the CNN.
  assert 'flower_audit.reconstruction.num_bins' in unused and 'flower_audit.hidden' in unused
  assert not any(f.startswith(('flower_audit.dp.', 'flower_audit.training.',
                               'flower_audit.dishonest.')) for f in unused)
  s.parts = ('reconstruction',)
  s.model = 'mlp'
  unused = pipeline.unused_fields(config)
  assert 'flower_audit.hidden' not in unused
  assert {'flower_audit.dp.num_trials', 'flower_audit.training.num_canaries',
          'flower_audit.dishonest.epsilon', 'flower_audit.attacks',
          'flower_audit.outlier_filter'} <= set(unused)
  # Nested settings are declared leaf by leaf (an override names a leaf).
  assert any(f.startswith('flower_audit.dp.settings.') and f.count('.') >= 4 for f in unused)
  assert not any(f.startswith('flower_audit.reconstruction.') for f in unused)


# A defense each experiment's clients can run, with one field it reads and one it does not.
_HONOURED = {'ami': ('mixup', 'mixup_alpha', 'clip_norm'),
             'dishonest_mia': ('update_dp', 'clip_norm', 'sigma'),
             'reconstruction': ('update_noise', 'sigma', 'clip_norm')}


@pytest.mark.parametrize('experiment', catalog.NAMES)
def test_every_experiment_refuses_the_defense_fields_its_clients_do_not_run(experiment):
  config = toy.get_config('smoke') if experiment == 'toy_game' else digits.get_config('smoke')
  pipeline = base.load(experiment)
  if 'defense' not in config:   # no section: the command line names the missing section
    problem = common.check_command_line(experiment, [
        'prog', '--config=configs/toy.py:smoke', '--config.defense.clip_norm=2.0'])
    assert problem.startswith('config.defense: must be a section or field of config'), problem
    return
  unused = base.unused(pipeline, config)
  # name 'none' reads nothing; the name itself is the pipeline's own check (check_honoured).
  assert 'defense.clip_norm' in unused and 'defense.name' not in unused
  assert set(unused) >= {f for f in base.leaf_fields(config.defense, 'defense')} - {'defense.name'}
  if catalog.get(experiment).defended:
    name, read, other = _HONOURED[experiment]
    config.defense.name = name
    unused = base.unused(pipeline, config)
    assert f'defense.{read}' not in unused, unused
    assert f'{name!r}' in unused[f'defense.{other}']
  else:
    assert 'runs no defense of the defense section' in unused['defense.clip_norm']


@pytest.mark.parametrize('name', ['none', 'update_noise', 'sparsify', 'quantize', 'mixup',
                                  'sampling', 'dp_sgd', 'update_dp', 'bitrand', 'ldp_sgd'])
def test_defense_reads_covers_what_configure_records(name):
  # Cross-check against the builder: every field `configure` records as a point's param
  # (`defense_<field>`) is one `defense_reads` keeps.
  config = digits.get_config('smoke')
  section = config.defense
  section.name = name
  setting = defenses.Setting(num_classes=10, image_shape=(8, 8, 1), batch_size=4,
                             num_examples=8)
  params = defenses.configure(section, setting, experiment='reconstruction').params
  recorded = {k[len('defense_'):] for k in params if k != 'defense'}
  reads = base.defense_reads(section)
  assert recorded <= reads, recorded - reads
  assert reads - recorded <= {'name', 'accountant', 'participation', 'target_epsilon'}
  section.target_epsilon = 4.0
  if name in defenses.DP_DEFENSES:
    assert 'noise_multiplier' not in base.defense_reads(section)


def test_training_audit_declares_what_its_chosen_threats_and_defenses_do_not_read():
  from fl_privacy.pipelines import training_audit  # pylint: disable=g-import-not-at-top
  config = digits.get_config('smoke')
  s = config.training_audit
  unused = training_audit.unused_fields(config)
  # The trainings are chunked by training_audit.chunk, never by the trial runner's fields.
  assert {'game.chunk_size', 'game.batch_bytes'} <= set(unused)
  assert not any(f.startswith('training_audit.') for f in unused)   # the default reads all
  s.threats = ('side_channel',)
  unused = training_audit.unused_fields(config)
  assert {'training_audit.record.canaries', 'training_audit.client.twins',
          'training_audit.chunk', 'training_audit.canary_norm'} <= set(unused)
  # The canaries' shares still size the federation the claim is calibrated for.
  assert 'training_audit.client.canary_share' not in unused
  assert 'training_audit.record.canaries_per_client' not in unused
  s.threats = ('all_iterates',)
  s.defenses = ('ldp_sgd',)
  unused = training_audit.unused_fields(config)
  assert 'pure epsilon' in unused['training_audit.accountant']
  s.defenses = ('ldp_sgd', 'update_dp')
  assert 'training_audit.accountant' not in training_audit.unused_fields(config)


def _two_updates(opt, lr):
  """The updates of two steps on the same gradient, in units of -lr x gradient."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  params = {'w': jnp.zeros(3)}
  grad = {'w': jnp.array([1.0, -2.0, 0.5])}
  state = opt.init(params)
  out = []
  for _ in range(2):
    upd, state = opt.update(grad, state, params)
    out.append(float(upd['w'][0]) / (-lr))
  return out


def test_sgd_has_no_momentum_in_any_experiment():
  # optimizer='sgd' is plain SGD wherever an experiment names its optimizer; heavy-ball
  # momentum is 'momentum' (a second step of momentum 0.9 moves 1.9 x lr x the gradient).
  from fl_privacy.fl import optimizers  # pylint: disable=g-import-not-at-top
  from fl_privacy.pipelines import fedmia  # pylint: disable=g-import-not-at-top
  from fl_privacy.pipelines import training_audit_runs  # pylint: disable=g-import-not-at-top
  config = digits.get_config('smoke')
  lr = float(config.dishonest.learning_rate)
  assert _two_updates(dishonest_mia.make_optimizer(config, 'sgd'), lr) == pytest.approx([1, 1])
  assert _two_updates(dishonest_mia.make_optimizer(config, 'momentum'), lr) == pytest.approx(
      [1, 1.9])
  config.dishonest.optimizers = ('sgd', 'adam')
  assert 'plain SGD' in dishonest_mia.unused_fields(config)['dishonest.momentum']
  config.fedmia.optimizer = 'sgd'
  config.fedmia.weight_decay = 0.0
  lr = float(config.fedmia.learning_rate)
  assert _two_updates(fedmia.make_optimizer(config)(0), lr) == pytest.approx([1, 1])  # round 0
  # The training audit's and the reconstruction client's optimizer: `optimizers.make(name, lr)`.
  assert _two_updates(training_audit_runs.optimizer('sgd', 0.5), 0.5) == pytest.approx([1, 1])
  assert _two_updates(optimizers.make('sgd', 0.1), 0.1) == pytest.approx([1, 1])


def test_data_unused_declares_only_a_present_attribute_off_celeb_a():
  # From base.data_unused's mutation survivors: no section, a data that is no section, a
  # section without the field, and CelebA each declare nothing.
  config = digits.get_config('smoke')
  assert base.data_unused(object()) == {}
  assert base.data_unused({'data': ['attribute']}) == {}
  assert set(base.data_unused(config)) == {'data.attribute'}
  del config.data['attribute']
  assert base.data_unused(config) == {}
  config = digits.get_config('smoke')
  config.data.name = 'celeb_a'
  assert base.data_unused(config) == {}


def test_defense_unused_declares_nothing_without_a_defense_section():
  # From base.defense_unused's mutation survivors.
  config = toy.get_config('smoke')
  assert 'defense' not in config
  assert base.defense_unused(config, 'toy_game') == {}
  # a field, not a section: nothing to declare
  assert base.defense_unused(ml_collections.ConfigDict({'defense': 'none'}),
                             'reconstruction') == {}


def test_defense_unused_names_what_the_defense_reads_in_its_messages():
  # From base.defense_unused's mutation survivors: the messages whole, the accountant's line
  # only for a DP defense with a target epsilon, nothing for a name validation refuses.
  config = digits.get_config('smoke')
  d = config.defense
  leaves = set(base.leaf_fields(d, 'defense')) - {'defense.name'}
  assert base.defense_unused(config, 'pastel') == dict.fromkeys(
      leaves, 'experiments.pastel runs no defense of the defense section (it sweeps or audits '
      'its own, or none)')
  d.name = 'none'
  assert base.defense_unused(config, 'reconstruction') == dict.fromkeys(
      leaves, "read only by other defenses (defense.name is 'none', which reads no field)")
  d.name = 'dp_sgd'
  why = ("read only by other defenses (defense.name is 'dp_sgd', which reads accountant, "
         'clip_norm, delta, dp_sgd_sampling, noise_multiplier, participation, target_epsilon)')
  read = {'defense.' + f for f in ('accountant', 'clip_norm', 'delta', 'dp_sgd_sampling',
                                   'noise_multiplier', 'participation', 'target_epsilon')}
  assert base.defense_unused(config, 'reconstruction') == dict.fromkeys(leaves - read, why)
  d.target_epsilon = 4.0
  unused = base.defense_unused(config, 'reconstruction')
  assert unused.pop('defense.noise_multiplier') == (
      'left to the accountant: defense.target_epsilon is set and the noise multiplier is '
      'calibrated to it')
  assert set(unused) == leaves - read
  d.name = 'no_such_defense'
  assert base.defense_unused(config, 'reconstruction') == {}
  config = ml_collections.ConfigDict({'defense': {'name': 3, 'clip_norm': 1.0}})
  assert base.defense_unused(config, 'reconstruction') == {}
