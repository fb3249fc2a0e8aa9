"""fl_privacy.accounting against dp-accounting called directly: validation, events, epsilon,
delta, calibration and the declarations of the shipped mechanisms (no JAX; a few seconds)."""

from __future__ import annotations

import dataclasses
import logging as std_logging
import math
import threading

from absl import logging
import dp_accounting
import pytest

from fl_privacy import accounting

NR = dp_accounting.privacy_accountant.NeighboringRelation
DELTA = 1e-5


def _decl(**kw):
  base = dict(mechanism='t', unit='record', relation='add_remove', adversary='server',
              sampling='none')
  base.update(kw)
  return accounting.Declaration(**base)


def _direct(event, accountant='rdp', relation=NR.ADD_OR_REMOVE_ONE):
  acc = (dp_accounting.rdp.RdpAccountant(neighboring_relation=relation) if accountant == 'rdp'
         else dp_accounting.pld.PLDAccountant())
  acc.compose(event)
  return acc


def _gauss(z, k=1):
  return dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(z), k)


# ----------------------------------------------------------------------------------------------
# Declaration validation: every branch, at its boundary.


@pytest.mark.parametrize('field', ['unit', 'relation', 'adversary', 'sampling'])
def test_each_enumerated_field_rejects_an_unknown_value(field):
  with pytest.raises(ValueError, match=rf"^{field} must be one of .*\(got 'bogus'\)$"):
    _decl(**{field: 'bogus'})


@pytest.mark.parametrize('field,allowed', [('unit', accounting.UNITS),
                                           ('relation', accounting.RELATIONS),
                                           ('adversary', accounting.ADVERSARIES),
                                           ('sampling', accounting.SAMPLINGS)])
def test_each_enumerated_field_accepts_every_allowed_value(field, allowed):
  for value in allowed:
    kw = {field: value}
    if value == 'without_replacement':
      kw.update(relation='replace_one', population=4, sample_size=2)
    if value == 'replace_one' and field == 'relation':
      kw.update(sampling='none')
    assert getattr(_decl(**kw), field) == value


def test_enumerations():
  assert accounting.UNITS == ('record', 'client')
  assert accounting.RELATIONS == ('add_remove', 'replace_one')
  assert accounting.ADVERSARIES == ('server', 'aggregate')
  assert set(accounting.SAMPLINGS) == {'poisson', 'without_replacement', 'shuffle', 'none'}
  assert accounting.ACCOUNTANTS == ('rdp', 'pld')


@pytest.mark.parametrize('bad', [0.0, -1.0, float('nan')])
def test_sensitivity_must_be_positive(bad):
  with pytest.raises(ValueError, match=r'^sensitivity must be > 0 \(got'):
    _decl(sensitivity=bad)
  assert _decl(sensitivity=1e-9).sensitivity == 1e-9


def test_compositions_must_be_at_least_one():
  with pytest.raises(ValueError, match=r'^compositions must be >= 1 \(got 0\)$'):
    _decl(compositions=0)
  assert _decl(compositions=1).compositions == 1


@pytest.mark.parametrize('bad', [0.0, -0.5, 1.0000001, float('nan')])
def test_sampling_rate_must_be_in_zero_one(bad):
  with pytest.raises(ValueError, match=r'^sampling_rate must be in \(0, 1\] \(got'):
    _decl(sampling_rate=bad)


def test_sampling_rate_accepts_its_closed_end_and_tiny_values():
  assert _decl(sampling_rate=1.0).sampling_rate == 1.0
  assert _decl(sampling='poisson', sampling_rate=1e-9).sampling_rate == 1e-9


def _wor(**kw):
  return _decl(relation='replace_one', sampling='without_replacement', **kw)


@pytest.mark.parametrize('n,m', [(10, 0), (10, 11), (None, 5), (10, None), (10.0, 5),
                                 (10, 5.0), (10, -1)])
def test_without_replacement_needs_integer_sizes_with_m_at_most_n(n, m):
  with pytest.raises(ValueError, match=r'^without_replacement needs 0 < sample_size <= '
                                       rf'population \(got {m} of {n}\)$'):
    _wor(population=n, sample_size=m)


def test_without_replacement_accepts_m_from_one_to_n():
  assert _wor(population=10, sample_size=1).sample_size == 1
  assert _wor(population=10, sample_size=10).sample_size == 10


def test_without_replacement_is_replace_one_only():
  with pytest.raises(ValueError, match='^sampling without replacement is accounted for '
                                       'replace_one only$'):
    _decl(sampling='without_replacement', population=10, sample_size=5)


def test_poisson_is_add_remove_only():
  with pytest.raises(ValueError, match='^Poisson sampling is accounted for add_remove only$'):
    _decl(relation='replace_one', sampling='poisson', sampling_rate=0.5)
  # Replace-one is fine without Poisson sampling.
  assert _decl(relation='replace_one', sampling='shuffle').relation == 'replace_one'


def test_level_and_describe():
  decl = _decl(unit='client', relation='add_remove', adversary='aggregate', sampling='poisson',
               compositions=7.0, sampling_rate=0.25)
  assert decl.level == 'client-level'
  assert _decl().level == 'record-level'
  got = accounting.describe(decl)
  assert got == {'dp_unit': 'client', 'dp_relation': 'add_remove', 'dp_adversary': 'aggregate',
                 'dp_sampling': 'poisson', 'dp_compositions': 7, 'dp_sampling_rate': 0.25}
  assert type(got['dp_compositions']) is int and type(got['dp_sampling_rate']) is float


def test_defaults_of_a_declaration():
  decl = _decl()
  assert (decl.sensitivity, decl.compositions, decl.sampling_rate) == (1.0, 1, 1.0)
  assert decl.population is decl.sample_size is decl.max_batch_size is decl.pure_epsilon is None
  assert decl.note == ''


# ----------------------------------------------------------------------------------------------
# Events and accountants, built independently with dp-accounting.


def test_event_of_each_sampling():
  z = 1.3
  poisson = _decl(sampling='poisson', sampling_rate=0.1, compositions=5, sensitivity=2.0)
  assert accounting.event(poisson, z) == dp_accounting.SelfComposedDpEvent(
      dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.GaussianDpEvent(z / 2)), 5)
  # Poisson at rate 1 is no sampling.
  full = _decl(sampling='poisson', sampling_rate=1.0, compositions=3)
  assert accounting.event(full, z) == _gauss(z, 3)
  wor = _wor(population=10, sample_size=4, compositions=2, sensitivity=2.0)
  assert accounting.event(wor, z) == dp_accounting.SelfComposedDpEvent(
      dp_accounting.SampledWithoutReplacementDpEvent(10, 4, dp_accounting.GaussianDpEvent(
          z / 2)), 2)
  # The whole population is no sampling.
  assert accounting.event(_wor(population=10, sample_size=10), z) == _gauss(z)
  assert accounting.event(_decl(sampling='shuffle', compositions=4), z) == _gauss(z, 4)


def test_truncated_poisson_event_only_under_pld():
  decl = _decl(sampling='poisson', sampling_rate=0.2, compositions=3, population=100,
               max_batch_size=30, sensitivity=2.0)
  assert accounting.event(decl, 1.2, accountant='pld') == dp_accounting.SelfComposedDpEvent(
      dp_accounting.TruncatedSubsampledGaussianDpEvent(100, 0.2, 30, 0.6), 3)
  plain = dp_accounting.SelfComposedDpEvent(
      dp_accounting.PoissonSampledDpEvent(0.2, dp_accounting.GaussianDpEvent(0.6)), 3)
  assert accounting.event(decl, 1.2, accountant='rdp') == plain
  assert accounting.event(decl, 1.2) == plain
  untruncated = dataclasses.replace(decl, max_batch_size=None)
  assert accounting.event(untruncated, 1.2, accountant='pld') == plain
  with pytest.raises(ValueError, match='^a truncated Poisson event needs the population size$'):
    accounting.event(dataclasses.replace(decl, population=None), 1.2, accountant='pld')


# Built at import: mutmut ties Declaration.__post_init__ only to the fast tests that build one.
_TRUNCATED = _decl(sampling='poisson', sampling_rate=0.2, compositions=1, population=20,
                   max_batch_size=5, sensitivity=2.0)
_POISSON = _decl(sampling='poisson', sampling_rate=0.05, compositions=3, sensitivity=2.0)
_PLAIN = _decl()
_FIVE = _decl(compositions=5)
_WOR = _decl(relation='replace_one', sampling='without_replacement', population=10,
             sample_size=4, compositions=3, sensitivity=2.0)


def test_truncated_poisson_epsilon_equals_pld_called_directly():
  # (Slow: each truncated PLD takes seconds; the event test covers delta_for's shared path.)
  decl = _TRUNCATED
  want = _direct(dp_accounting.SelfComposedDpEvent(
      dp_accounting.TruncatedSubsampledGaussianDpEvent(20, 0.2, 5, 2.0), 1), 'pld')
  assert accounting.epsilon(decl, 4.0, delta=DELTA, accountant='pld') == pytest.approx(
      want.get_epsilon(DELTA), rel=1e-9)


def test_accountant_choice():
  with pytest.raises(ValueError, match=r"^accountant must be one of \('rdp', 'pld'\) "
                                       r"\(got 'moments'\)$"):
    accounting.epsilon(_decl(), 1.0, delta=DELTA, accountant='moments')
  wor = _wor(population=10, sample_size=4)
  with pytest.raises(ValueError, match='^sampling without replacement is accounted by the rdp '
                                       'accountant only$'):
    accounting.epsilon(wor, 1.0, delta=DELTA, accountant='pld')
  acc = accounting._accountant(wor, 'rdp')
  assert isinstance(acc, dp_accounting.rdp.RdpAccountant)
  assert acc.neighboring_relation == NR.REPLACE_ONE
  for sampling in ('none', 'shuffle', 'poisson'):
    decl = _decl(sampling=sampling)
    rdp = accounting._accountant(decl, 'rdp')
    assert isinstance(rdp, dp_accounting.rdp.RdpAccountant)
    assert rdp.neighboring_relation == NR.ADD_OR_REMOVE_ONE
    pld = accounting._accountant(decl, 'pld')
    assert isinstance(pld, dp_accounting.pld.PLDAccountant)
    assert pld.neighboring_relation == NR.ADD_OR_REMOVE_ONE


def test_without_replacement_epsilon_is_rdp_replace_one():
  decl = _WOR
  event = dp_accounting.SelfComposedDpEvent(dp_accounting.SampledWithoutReplacementDpEvent(
      10, 4, dp_accounting.GaussianDpEvent(0.8)), 3)
  want = _direct(event, relation=NR.REPLACE_ONE).get_epsilon(DELTA)
  assert accounting.epsilon(decl, 1.6, delta=DELTA) == pytest.approx(want, rel=1e-12)
  # Amplified: less than the whole population released every time.
  assert want < _direct(_gauss(0.8, 3)).get_epsilon(DELTA)


@pytest.mark.parametrize('accountant', ['rdp', 'pld'])
def test_a_claim_is_composed_once_and_reading_it_changes_nothing(accountant, monkeypatch):
  calls = []
  real = accounting._accountant  # pylint: disable=protected-access

  def counting(decl, name):
    calls.append(name)
    return real(decl, name)

  monkeypatch.setattr(accounting, '_accountant', counting)
  accounting._composed_cached.cache_clear()  # pylint: disable=protected-access
  decl = _POISSON
  first = [accounting.epsilon(decl, 2.7, delta=d, accountant=accountant) for d in (1e-5, 1e-3)]
  curve = accounting.delta_curve(decl, 2.7, (0.5, 1.0), accountant=accountant)
  again = [accounting.epsilon(decl, 2.7, delta=d, accountant=accountant) for d in (1e-5, 1e-3)]
  assert calls == [accountant] and first == again
  want = _direct(accounting.event(decl, 2.7, accountant=accountant), accountant)
  assert first == [want.get_epsilon(1e-5), want.get_epsilon(1e-3)]
  assert curve == [want.get_delta(0.5), want.get_delta(1.0)]
  accounting.epsilon(decl, 2.8, delta=1e-5, accountant=accountant)  # another noise: composed
  assert calls == [accountant, accountant]


# ----------------------------------------------------------------------------------------------
# epsilon, delta_for, noise_multiplier_for.


@pytest.mark.parametrize('accountant', ['rdp', 'pld'])
def test_epsilon_and_delta_equal_dp_accounting(accountant):
  decl = _POISSON
  want = _direct(dp_accounting.SelfComposedDpEvent(
      dp_accounting.PoissonSampledDpEvent(0.05, dp_accounting.GaussianDpEvent(1.5)), 3),
      accountant)
  assert accounting.epsilon(decl, 3.0, delta=DELTA, accountant=accountant) == pytest.approx(
      want.get_epsilon(DELTA), rel=1e-12)
  for eps in (0.25, 1.0):
    assert accounting.delta_for(decl, 3.0, epsilon_=eps, accountant=accountant) == (
        pytest.approx(want.get_delta(eps), rel=1e-12))


def test_epsilon_and_delta_without_noise():
  decl = _decl(compositions=3)
  for z in (None, 0.0, -1.0):
    assert accounting.epsilon(decl, z, delta=DELTA) == math.inf
  assert accounting.epsilon(decl, delta=DELTA) == math.inf
  assert accounting.delta_for(decl, 0.0, epsilon_=5.0) == 1.0
  assert accounting.delta_for(decl, -1.0, epsilon_=5.0) == 1.0
  assert accounting.epsilon(decl, 1e-3, delta=DELTA) > 1e3  # tiny noise: finite, huge


def test_epsilon_ignores_integer_and_float_forms():
  decl = _decl(compositions=3)
  assert accounting.epsilon(decl, 2, delta=DELTA) == accounting.epsilon(decl, 2.0, delta=DELTA)


@pytest.mark.parametrize('delta', [0.0, 1.0, -0.1, 1.5])
def test_delta_must_be_in_zero_one(delta):
  with pytest.raises(ValueError, match=rf'^delta must be in \(0, 1\) \(got {float(delta)}\)$'):
    accounting.epsilon(_decl(), 1.0, delta=delta)
  with pytest.raises(ValueError, match=r'^delta must be in \(0, 1\)'):
    accounting.noise_multiplier_for(_decl(), 1.0, delta=delta)


def test_delta_close_to_its_ends_is_accepted():
  assert math.isfinite(accounting.epsilon(_decl(), 1.0, delta=1e-300))
  assert accounting.epsilon(_decl(), 1.0, delta=1 - 1e-9) == 0.0


def test_pure_epsilon_composes_basically():
  decl = _decl(relation='replace_one', sensitivity=2.0, compositions=4, pure_epsilon=0.75)
  for z in (None, 0.0, 3.0):
    assert accounting.epsilon(decl, z, delta=DELTA) == 3.0
  with pytest.raises(ValueError, match='delta'):
    accounting.epsilon(decl, delta=0.0)
  # Its privacy profile: delta 0 from the composed epsilon on; below it randomized response's
  # hockey-stick divergence (e^3 - e^e) / (1 + e^3), checked against RR's two outcomes.
  assert accounting.delta_for(decl, 0.0, epsilon_=3.0) == 0.0
  assert accounting.delta_for(decl, 0.0, epsilon_=3.5) == 0.0
  p = math.exp(3.0) / (1 + math.exp(3.0))
  for e in (0.0, 1.0, 2.999):
    rr = max(p - math.exp(e) * (1 - p), 0.0) + max((1 - p) - math.exp(e) * p, 0.0)
    assert accounting.delta_for(decl, 1.0, epsilon_=e) == pytest.approx(rr, rel=1e-12)
  assert accounting.delta_for(decl, 1.0, epsilon_=0.0) == pytest.approx(2 * p - 1)
  with pytest.raises(ValueError, match='^t is pure epsilon-DP: it has no noise multiplier$'):
    accounting.noise_multiplier_for(decl, 1.0, delta=DELTA)


@pytest.mark.parametrize('bad', [0, 0.0, -1.0, math.inf, math.nan, '1.0', None])
def test_noise_multiplier_for_rejects_a_bad_target(bad):
  with pytest.raises(ValueError, match=r'^target_epsilon must be a finite number > 0 \(got'):
    accounting.noise_multiplier_for(_decl(), bad, delta=DELTA)


@pytest.mark.parametrize('accountant,decl,target', [
    ('rdp', _decl(compositions=10), 8.0),
    ('rdp', _decl(compositions=2, sensitivity=2.0), 1),
])
def test_noise_multiplier_for_is_the_smallest_that_meets_the_target(accountant, decl, target):
  z = accounting.noise_multiplier_for(decl, target, delta=DELTA, accountant=accountant)
  assert isinstance(z, float)
  rel = NR.REPLACE_ONE if decl.sampling == 'without_replacement' else NR.ADD_OR_REMOVE_ONE

  def direct(zz):
    event = accounting.event(decl, zz, accountant=accountant)
    return _direct(event, accountant, rel).get_epsilon(DELTA)

  assert direct(z) <= target
  assert direct(z * 0.99) > target


@pytest.mark.parametrize('target', [2.0])
def test_noise_multiplier_for_under_pld(target):
  """Once a MemoryError (the search tried z = 1e-3); now bracketed by the RDP answer."""
  decl = _decl(sampling='poisson', sampling_rate=0.1, compositions=10)
  z = accounting.noise_multiplier_for(decl, target, delta=DELTA, accountant='pld')
  assert accounting.epsilon(decl, z, delta=DELTA, accountant='pld') <= target
  assert accounting.epsilon(decl, z * 0.98, delta=DELTA, accountant='pld') > target * 0.999
  assert z <= accounting.noise_multiplier_for(decl, target, delta=DELTA)  # RDP is looser


def test_noise_multiplier_for_reaches_below_one():
  # A large target needs little noise: the search is not floored at its first guess.
  z = accounting.noise_multiplier_for(_PLAIN, 20.0, delta=DELTA)
  assert z < 0.5
  assert _direct(_gauss(z)).get_epsilon(DELTA) <= 20.0
  assert _direct(_gauss(z * 0.99)).get_epsilon(DELTA) > 20.0


# ----------------------------------------------------------------------------------------------
# dp-accounting's warnings are muted in the accounting thread while composing, nowhere else.


def test_quiet_mutes_this_threads_warnings_only_and_never_the_verbosity():
  records = []

  class Keep(std_logging.Handler):
    def emit(self, record):
      records.append((record.getMessage(), threading.get_ident()))

  handler = Keep()
  absl_logger = logging.get_absl_logger()
  absl_logger.addHandler(handler)
  old = logging.get_verbosity()
  try:
    logging.set_verbosity(logging.INFO)
    inside, released = threading.Event(), threading.Event()

    def quiet_thread():
      with accounting._quiet():  # pylint: disable=protected-access
        with accounting._quiet():  # pylint: disable=protected-access
          logging.warning('muted, nested')
        logging.warning('muted, outer')
        logging.error('errors still show')
        inside.set()
        released.wait(10)
      logging.warning('shown after')

    t = threading.Thread(target=quiet_thread)
    t.start()
    assert inside.wait(10)
    # While the other thread accounts, this one's records and the verbosity are untouched.
    assert logging.get_verbosity() == logging.INFO
    logging.warning('shown meanwhile')
    released.set()
    t.join(10)
    with pytest.raises(RuntimeError):
      with accounting._quiet():  # pylint: disable=protected-access
        raise RuntimeError('inside')
    logging.warning('shown after an exception')
    accounting.epsilon(_PLAIN, 1.0, delta=DELTA)
    assert logging.get_verbosity() == logging.INFO
  finally:
    logging.set_verbosity(old)
    absl_logger.removeHandler(handler)
  assert [m for m, _ in records] == ['errors still show', 'shown meanwhile', 'shown after',
                                     'shown after an exception']


def test_accounting_is_quiet(monkeypatch):
  seen = []

  def compose(self, event, count=1):
    seen.append(('compose', accounting._muted()))  # pylint: disable=protected-access
    return real_compose(self, event, count)

  def get_epsilon(self, delta):
    seen.append(('epsilon', accounting._muted()))  # pylint: disable=protected-access
    return real_eps(self, delta)

  def get_delta(self, eps):
    seen.append(('delta', accounting._muted()))  # pylint: disable=protected-access
    return real_delta(self, eps)

  cls = dp_accounting.rdp.RdpAccountant
  real_compose, real_eps, real_delta = cls.compose, cls.get_epsilon, cls.get_delta
  monkeypatch.setattr(cls, 'compose', compose)
  monkeypatch.setattr(cls, 'get_epsilon', get_epsilon)
  monkeypatch.setattr(cls, 'get_delta', get_delta)
  old = logging.get_verbosity()
  try:
    logging.set_verbosity(logging.INFO)
    accounting.epsilon(_PLAIN, 1.0, delta=DELTA)
    accounting.delta_for(_PLAIN, 1.0, epsilon_=1.0)
    accounting.noise_multiplier_for(_FIVE, 2.5, delta=DELTA)
  finally:
    logging.set_verbosity(old)
  assert {kind for kind, _ in seen} == {'compose', 'epsilon', 'delta'}
  assert all(muted for _, muted in seen)
  assert not accounting._muted()  # pylint: disable=protected-access


# ----------------------------------------------------------------------------------------------
# The shipped declarations.


def test_dp_sgd_declarations():
  poisson = accounting.dp_sgd(batch_size=32, num_examples=1000, steps=50.0, epochs=2,
                              max_batch_size=64)
  assert poisson == accounting.Declaration(
      'dp_sgd', 'record', 'add_remove', 'server', 'poisson', 1.0, 50, 0.032, population=1000,
      max_batch_size=64)
  assert type(poisson.compositions) is int and type(poisson.population) is int
  assert accounting.dp_sgd(batch_size=32, num_examples=1000, steps=1,
                           epochs=1).max_batch_size is None
  # A batch larger than the dataset samples everything.
  assert accounting.dp_sgd(batch_size=50, num_examples=20, steps=3,
                           epochs=1).sampling_rate == 1.0
  assert accounting.dp_sgd(batch_size=20, num_examples=20, steps=3,
                           epochs=1).sampling_rate == 1.0
  shuffle = accounting.dp_sgd(batch_size=32, num_examples=1000, steps=50, epochs=2.0,
                              sampling='shuffle')
  assert shuffle == accounting.Declaration(
      'dp_sgd', 'record', 'replace_one', 'server', 'shuffle', 2.0, 2,
      note='one Gaussian release per epoch, no amplification')
  assert type(shuffle.compositions) is int
  with pytest.raises(ValueError, match=r"^dp_sgd sampling must be 'poisson' or 'shuffle' "
                                       r"\(got 'none'\)$"):
    accounting.dp_sgd(batch_size=1, num_examples=2, steps=1, epochs=1, sampling='none')


def test_update_dp_ldp_sgd_and_gaussian_input_declarations():
  assert accounting.update_dp(rounds=7.0) == accounting.Declaration(
      'update_dp', 'client', 'replace_one', 'server', 'none', 2.0, 7)
  ldp = accounting.ldp_sgd(epsilon_per_report=1, rounds=3.0)
  assert ldp == accounting.Declaration('ldp_sgd', 'client', 'replace_one', 'server', 'none',
                                       2.0, 3, pure_epsilon=1.0)
  assert type(ldp.pure_epsilon) is float and type(ldp.compositions) is int
  assert accounting.gaussian_input() == accounting.Declaration(
      'gaussian', 'record', 'replace_one', 'server', 'none', 1.0, 1)


def test_server_dp_declarations():
  every = accounting.server_dp('central_dp', rounds=6, num_clients=5.0)
  assert every == accounting.Declaration('central_dp', 'client', 'replace_one', 'aggregate',
                                         'none', 2.0, 6, 1.0, population=5, sample_size=5)
  assert accounting.server_dp('central_dp', rounds=6, num_clients=5, participants=5) == every
  some = accounting.server_dp('central_dp', rounds=6.0, num_clients=5, participants=2.0)
  assert some == accounting.Declaration('central_dp', 'client', 'replace_one', 'aggregate',
                                        'without_replacement', 2.0, 6, 0.4, population=5,
                                        sample_size=2)
  assert type(some.sample_size) is int and type(some.compositions) is int
  weak = accounting.server_dp('weak_dp', rounds=6, num_clients=5, participants=2,
                              per_round=True)
  assert weak == dataclasses.replace(some, mechanism='weak_dp', compositions=1,
                                     note='calibrated per round')


def test_delta_for_and_calibration_compose_the_truncated_event_under_pld(monkeypatch):
  # Spies, since a truncated PLD costs seconds per evaluation: what is composed must be the
  # truncated event, and the PLD search is bracketed by the RDP answer.
  truncated = dp_accounting.SelfComposedDpEvent(
      dp_accounting.TruncatedSubsampledGaussianDpEvent(20, 0.2, 5, 1.5), 1)
  composed = []
  monkeypatch.setattr(dp_accounting.pld.PLDAccountant, 'compose',
                      lambda self, event, count=1: composed.append(event))
  monkeypatch.setattr(dp_accounting.pld.PLDAccountant, 'get_delta', lambda self, eps: 0.25)
  assert accounting.delta_for(_TRUNCATED, 3.0, epsilon_=1.0, accountant='pld') == 0.25
  assert composed == [truncated]
  calls = []

  def calibrate(make_accountant, make_event, target, delta, bracket):
    calls.append((type(make_accountant()), make_event(3.0), target, delta, bracket))
    return 3

  monkeypatch.setattr(dp_accounting, 'calibrate_dp_mechanism', calibrate)
  # Half of the RDP answer spends more than the target under PLD: the bracketed search runs.
  monkeypatch.setattr(dp_accounting.pld.PLDAccountant, 'get_epsilon', lambda self, d: 9.0)
  z = accounting.noise_multiplier_for(_TRUNCATED, 2, delta=DELTA, accountant='pld')
  assert z == 3.0 and type(z) is float
  (rdp, rdp_event, *_, rdp_bracket), (pld, pld_event, target, delta, bracket) = calls
  assert rdp is dp_accounting.rdp.RdpAccountant and rdp_bracket.lower_endpoint == 1e-3
  assert (pld, pld_event, target, delta) == (dp_accounting.pld.PLDAccountant, truncated, 2.0,
                                             DELTA)
  assert (bracket.endpoint_1, bracket.endpoint_2) == (1.5, 3.0)


def test_a_target_above_the_least_noise_is_unreachable_not_a_bracketing_error():
  # defense.target_epsilon=1e9 ended in dp-accounting's NoBracketIntervalFoundError mid-run.
  decl = accounting.update_dp(rounds=1)
  floor = accounting.epsilon(decl, accounting.MIN_NOISE_MULTIPLIER, delta=1e-5)
  with pytest.raises(accounting.UnreachableTargetError) as info:
    accounting.noise_multiplier_for(decl, 1e9, delta=1e-5)
  assert info.value.max_epsilon == pytest.approx(floor) and info.value.target_epsilon == 1e9
  with pytest.raises(accounting.UnreachableTargetError):
    accounting.noise_multiplier_for(decl, 1e9, delta=1e-5, accountant='pld')
  z = accounting.noise_multiplier_for(decl, floor / 2, delta=1e-5)  # below it: calibrated
  assert z > accounting.MIN_NOISE_MULTIPLIER
