"""Settings whose arrays cannot fit the device are refused before any work, naming the field."""

import pytest

from fl_privacy import memory
from fl_privacy import models
from fl_privacy import validate


def test_require_fits_names_the_field_the_estimate_and_the_limit(monkeypatch):
  monkeypatch.setattr(memory, 'device_memory', lambda: (2**30, 'the machine\'s memory'))
  memory.require_fits('ami.copies', 10, 2**30, 'x')  # exactly the limit fits
  with pytest.raises(validate.ConfigError) as info:
    memory.require_fits('ami.copies', 10**9, 3 * 2**30, 'the copies')
  assert str(info.value) == ('config.ami.copies: must be small enough for the copies to fit in '
                             'memory: ~3.0 GiB > 1.0 GiB of the machine\'s memory '
                             '(got 1000000000)')
  monkeypatch.setattr(memory, 'device_memory', lambda: (None, 'unknown'))
  memory.require_fits('ami.copies', 10**9, 10**18, 'x')  # unknown memory: never refused


def test_largest_activation_is_the_widest_layer_per_example():
  mlp = models.make('mlp', 10, hidden=(300,))
  assert memory.largest_activation(mlp, (8, 8, 1)) == 300
  assert memory.largest_activation(models.make('mlp', 10, hidden=(3,)), (8, 8, 1)) == 64


def test_device_memory_is_known_here():
  limit, where = memory.device_memory()
  assert limit is None or (limit > 2**20 and 'memory' in where)


def test_fedmia_batch_that_cannot_fit_is_refused_before_training(monkeypatch):
  from configs import digits  # pylint: disable=g-import-not-at-top
  from fl_privacy.pipelines import fedmia  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(memory, 'device_memory', lambda: (2**16, 'the machine\'s memory'))
  config = digits.get_config('smoke')
  config.fedmia.batch_size = 1000
  monkeypatch.setattr(fedmia, 'record', lambda *a, **k: pytest.fail('trained'))
  with pytest.raises(validate.ConfigError, match='config.fedmia.batch_size: must be small '
                     'enough for the clients\' largest activation'):
    fedmia.prepare(config)


@pytest.mark.parametrize('fields,needle', [
    # Unequal shards pad every minibatch to B slots: a B beyond the data only allocates.
    ({'batch_size': 10**5}, 'config.fedmia.batch_size: must be <= 1438, the training examples'),
    # Equal shards draw full minibatches: B above the shard failed mid-run.
    ({'per_client': 4, 'batch_size': 32}, 'config.fedmia.batch_size: must be <= '
     'fedmia.per_client = 4'),
])
def test_fedmia_batch_beyond_the_data_is_refused_before_training(monkeypatch, fields, needle):
  from configs import digits  # pylint: disable=g-import-not-at-top
  from fl_privacy.pipelines import fedmia  # pylint: disable=g-import-not-at-top
  config = digits.get_config('smoke')
  for k, v in fields.items():
    config.fedmia[k] = v
  monkeypatch.setattr(fedmia, 'record', lambda *a, **k: pytest.fail('trained'))
  with pytest.raises(validate.ConfigError, match=needle):
    fedmia.prepare(config)


def test_fedmia_query_gradients_that_cannot_fit_are_refused_before_training(monkeypatch):
  # ResNet-18 on digits: 512 per-query gradients of 11.2M parameters, held twice (~43 GiB);
  # the memory check of the activations passed and the run ran out of memory mid-run.
  from configs import digits  # pylint: disable=g-import-not-at-top
  from fl_privacy.pipelines import fedmia  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(memory, 'device_memory', lambda: (2**34, 'the machine\'s memory'))
  config = digits.get_config('smoke')
  config.fedmia.models = ('resnet18_gn',)
  config.fedmia.chunk_size = 512  # digits' default is 32
  monkeypatch.setattr(fedmia, 'record', lambda *a, **k: pytest.fail('trained'))
  with pytest.raises(validate.ConfigError, match=r'config.fedmia.chunk_size: must be small '
                     r'enough for the per-query gradients \(512 queries x 11,172,810 '
                     r'parameters x 4 bytes, held twice while flattened\) to fit in memory: '
                     r'~42.6 GiB > 16.0 GiB'):
    fedmia.prepare(config)
  config.fedmia.chunk_size = 64  # 64 x 11.2M x 4 x 2 = 5.3 GiB fits
  fedmia.prepare(config)


def test_num_parameters_counts_the_params_collection():
  mlp = models.make('mlp', 10, hidden=(300,))
  assert memory.num_parameters(mlp, (8, 8, 1)) == 64 * 300 + 300 + 300 * 10 + 10
