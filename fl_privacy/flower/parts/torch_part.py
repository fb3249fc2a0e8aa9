"""The `torch` part of `flower_audit`: the PyTorch + Opacus Flower App, audited per record.

Runs the repository's PyTorch app (`flower_torch_app/`, package `torch_audit_app`: Flower's
`opacus` example's shape, a small CNN on the offline digits, every node training with
Opacus's DP-SGD, one node holding record-level canaries) once per setting of
`flower_audit.torch.settings`, on the chosen engine:

- 'inprocess': the app's own ServerApp main (`server_app.serve`) on fl_privacy's
  `InProcessGrid` with the app's `ClientApp` on every node (one process);
- 'deployment' / 'simulation': `flwr run flower_torch_app` against a local SuperLink with
  SuperNodes, or a SuperLink in simulation mode (`LocalDeployment`), the record written by
  the ServerApp to the point's work directory.

Then audits what the run recorded (`audits.opacus_record`: one-run bounds per threat against
Opacus's RDP and PRV epsilons) and returns one point per setting: `privacy_violation` and
`verdict` over both claims (a violation of either claim is a violation), per claim
`<claim>/verdict`, `/claimed_epsilon`, `/best_bound`, per claim and threat
`<claim>/<threat>/epsilon_one_run`, `/max_certifiable`, `/verdict`, the confidence, the
utility (test accuracy and loss, seconds per round) and the node's Opacus noise, rate and
steps. A plant Opacus refuses (BatchNorm) gives `verdict` 'refused' and the reason.

torch and opacus are imported only when a point runs (the `torch` extra).
"""

from __future__ import annotations

import contextlib
import logging
import math
import pathlib
import sys
import time
import tomllib
from typing import Any

import numpy as np

from fl_privacy import validate as validate_lib
from fl_privacy.flower.audits import opacus_record
from fl_privacy.flower.engines import deployment as deployment_lib
from fl_privacy.flower.engines import inprocess

APP_DIR = pathlib.Path(__file__).resolve().parents[3] / 'flower_torch_app'
ENGINES = ('inprocess', 'deployment', 'simulation')
# The app's plants (torch_audit_app.opacus_hooks.PLANTS, which imports torch; a test checks
# they agree).
PLANTS = ('none', 'noise_mismatch', 'no_poisson', 'batch_mean_clip', 'batchnorm')
CLIENT_DP = ('none', 'server_fixed', 'local_dp')  # torch_audit_app.server_app.CLIENT_DP


def default_run_config() -> dict[str, Any]:
  """The app's run config defaults (its pyproject.toml)."""
  with open(APP_DIR / 'pyproject.toml', 'rb') as f:
    return dict(tomllib.load(f)['tool']['flwr']['app']['config'])


def run_config(**overrides) -> dict[str, Any]:
  """The defaults with `overrides` (keys with '-' or '_'); an unknown key is an error."""
  cfg = default_run_config()
  for k, v in overrides.items():
    key = k.replace('_', '-')
    if key not in cfg:
      raise ValueError(f'unknown run config key {key!r} of the torch app (known: '
                       f'{sorted(cfg)})')
    cfg[key] = type(cfg[key])(v) if not isinstance(cfg[key], bool) else bool(v)
  return cfg


def _app_modules():
  if str(APP_DIR) not in sys.path:
    sys.path.insert(0, str(APP_DIR))
  # pylint: disable=import-outside-toplevel
  from torch_audit_app import client_app, server_app
  return client_app, server_app


# The metric keys the torch app's train replies carry (client-level canaries reply 0.0 for
# each: FedAvg refuses replies whose keys differ).
REPLY_METRICS = ('train-loss', 'epsilon-rdp', 'epsilon-prv', 'noise-multiplier', 'sample-rate',
                 'steps-total', 'steps-round')


def node_configs(cfg: dict[str, Any], num_nodes: int) -> list[dict[str, Any]]:
  """The real nodes' node configs (`num-partitions` = the real nodes), then the client-level
  canary SuperNodes' (`client-canaries` of them, the vendored `canary_node_configs`, weighing
  what a real shard weighs)."""
  client_app, _ = _app_modules()
  task = sys.modules['torch_audit_app.task']
  k = int(cfg.get('client-canaries', 0))
  real = [{'partition-id': i, 'num-partitions': int(num_nodes)} for i in range(int(num_nodes))]
  if k == 0:
    return real
  shard = len(task.partition(1 % int(num_nodes), int(num_nodes), str(cfg.get('data-npz', '')))[1])
  return real + client_app.fl_privacy_canaries.canary_node_configs(
      k, seed=int(cfg['canary-seed']), canary_norm=float(cfg['client-canary-norm']),
      clip_norm=float(cfg['client-dp-clip']), **{
          'canary-metrics': ','.join(REPLY_METRICS), 'num-examples': shard})


def run_inprocess(cfg: dict[str, Any], num_nodes: int) -> dict[str, Any]:
  """The app on `InProcessGrid` (the app's ServerApp main and ClientApp, one process, plus
  `client-canaries` canary nodes); the record as `opacus_record.load` returns it, with the
  client-level canaries' audit under 'client_audit' when there are any (their recording goes
  to `record-dir`, or a temporary folder)."""
  import tempfile  # pylint: disable=import-outside-toplevel
  from flwr.common.constant import SUPERLINK_NODE_ID  # pylint: disable=import-outside-toplevel
  client_app, server_app = _app_modules()
  configs = node_configs(cfg, num_nodes)
  with tempfile.TemporaryDirectory() as tmp:
    if int(cfg.get('client-canaries', 0)) and not cfg.get('record-dir'):
      cfg = dict(cfg, **{'record-dir': tmp})
    grid = inprocess.InProcessGrid([client_app.app] * len(configs), run_config=cfg,
                                   node_configs=configs)
    with inprocess.task_identity(grid.run.run_id, SUPERLINK_NODE_ID), _quiet_flower():
      rec = server_app.serve(grid, cfg)
    rec = _decoded(rec)
    if int(cfg.get('client-canaries', 0)):
      rec['client_audit'] = client_audit(cfg['record-dir'])
  return rec


def client_audit(record_dir) -> dict[str, Any]:
  """The client-level canaries' audit (`audits.user_app`) of `<record_dir>/canary_rounds.npz`."""
  from fl_privacy.flower.audits import user_app  # pylint: disable=import-outside-toplevel
  meta, rounds = user_app.load_rounds(pathlib.Path(record_dir) / user_app.ROUNDS_FILE)
  return user_app.audit_recording(meta, rounds)


@contextlib.contextmanager
def _quiet_flower():
  """Flower's per-round INFO log (a page a run) down to warnings, restored after."""
  logger = logging.getLogger('flwr')
  level = logger.level
  logger.setLevel(logging.WARNING)
  try:
    yield
  finally:
    logger.setLevel(level)


def run_flwr(cfg: dict[str, Any], num_nodes: int, workdir: str | pathlib.Path, *,
             simulation: bool = False, timeout: float = 1800.0) -> dict[str, Any]:
  """`flwr run flower_torch_app` on a local deployment (`simulation` False: one SuperLink and
  `num_nodes` SuperNodes) or a simulation-mode SuperLink; the record it wrote."""
  workdir = pathlib.Path(workdir)
  record_dir = workdir / 'record'
  with contextlib.suppress(FileNotFoundError):
    (record_dir / 'record.npz').unlink()
  cfg = dict(cfg, **{'record-dir': str(record_dir)})
  configs = None if simulation else node_configs(cfg, num_nodes)
  if simulation and int(cfg.get('client-canaries', 0)):
    raise ValueError('client-canaries: a simulation-mode SuperLink has no SuperNodes to '
                     "configure as canaries (use engine 'inprocess' or 'deployment')")
  deployment = deployment_lib.LocalDeployment(len(configs) if configs else int(num_nodes),
                                              workdir / 'deployment', node_configs=configs,
                                              simulation=simulation)
  with deployment:
    run_id = deployment.submit(cfg, app_dir=APP_DIR)
    entry = deployment.wait(run_id, timeout)
  path = record_dir / 'record.npz'
  if not path.exists():
    raise RuntimeError(f"torch app run {run_id} {entry.get('status')}: no record written "
                       f"(logs in {workdir / 'deployment'})")
  rec = opacus_record.load(path)
  if int(cfg.get('client-canaries', 0)):
    rec['client_audit'] = client_audit(record_dir)
  return rec


def _decoded(rec: dict[str, Any]) -> dict[str, Any]:
  import json  # pylint: disable=import-outside-toplevel
  rec = dict(rec)
  rec['run_config'] = json.loads(str(rec['run_config']))
  rec['errors'] = json.loads(str(rec['errors']))
  return rec


def run(cfg: dict[str, Any], num_nodes: int, engine: str = 'inprocess',
        workdir: str | pathlib.Path | None = None) -> dict[str, Any]:
  if engine not in ENGINES:
    raise ValueError(f'engine must be one of {ENGINES} (got {engine!r})')
  if engine == 'inprocess':
    return run_inprocess(cfg, num_nodes)
  if workdir is None:
    raise ValueError(f'engine {engine!r} needs a work directory')
  return run_flwr(cfg, num_nodes, workdir, simulation=engine == 'simulation')


def metrics(rec: dict[str, Any], confidence: float = 0.95) -> dict[str, Any]:
  """One point's metrics from a record (module docstring)."""
  rows = opacus_record.audit(rec, confidence)
  client = client_metrics(rec)
  if not rows:  # no record-level canaries: the utility (and the client level) only
    return {'verdict': 'not audited', 'privacy_violation': math.nan,
            **opacus_record.utility(rec), **client}
  m: dict[str, Any] = {'plant': rows[0]['plant'], 'unit': 'record',
                       'relation': 'add_remove', 'sampling': rows[0]['sampling'],
                       'verdict_confidence': float(confidence)}
  verdicts = []
  for r in rows:
    c = r['claim']
    verdicts.append(r['verdict'])
    m[f'{c}/verdict'] = r['verdict']
    if r['verdict'] == 'refused':
      m['reason'] = r['reason']
      continue
    m[f'{c}/claimed_epsilon'] = r['claimed_epsilon']
    m[f'{c}/best_bound'] = r['claim_best_bound']
    m['delta'] = r['delta']
    t = r['threat']
    for k in ('epsilon_one_run', 'max_certifiable', 'epsilon_estimate', 'n_in', 'n_out',
              'bound_confidence', 'canaries_needed'):
      m[f'{c}/{t}/{k}'] = r[k]
    m[f'{c}/{t}/verdict'] = r['threat_verdict']
  m.update(client)
  order = ('violation', 'refused', 'no violation', 'cannot refute')
  m['verdict'] = min(verdicts, key=order.index)
  m['privacy_violation'] = (math.nan if m['verdict'] == 'refused'
                            else float(m['verdict'] == 'violation'))
  if m['verdict'] != 'refused':
    m['best_bound'] = max(m[f'{c}/best_bound'] for c in opacus_record.CLAIMS)
    m.update(opacus_record.utility(rec))
  else:
    m['test_accuracy'] = float(rec['test_accuracy'][-1])
  return m


def client_metrics(rec: dict[str, Any]) -> dict[str, Any]:
  """The client-level canaries' audit fields as `client/<field>` ({} without them): the best
  counted one-run bound, what the canaries could certify, Flower's stated epsilon and the
  violation flag (`audits.user_app`, family-wise at its confidence)."""
  ca = rec.get('client_audit')
  if ca is None:
    return {}
  out = {f'client/{k}': ca[k] for k in (
      'best_bound', 'max_certifiable', 'stated_epsilon', 'stated_epsilon_source',
      'privacy_violation', 'num_canaries', 'n_in', 'n_out', 'verdict_confidence', 'unit',
      'relation', 'adversary', 'all_iterates/epsilon_fit', 'all_iterates/epsilon_fit_ci_low',
      'all_iterates/epsilon_fit_ci_high') if k in ca}
  stated = float(ca.get('stated_epsilon', math.nan))
  out['client/verdict'] = (
      'no claim' if math.isnan(stated) else
      'violation' if float(ca['best_bound']) > stated else
      'no violation' if float(ca['max_certifiable']) > stated else 'cannot refute')
  return out


def setting_seed(key_data: np.ndarray | None, name: str) -> int:
  """The run's seed from the experiment key and the setting's name."""
  words = [] if key_data is None else [int(v) for v in np.asarray(key_data).ravel()]
  return int(np.random.SeedSequence(words + [ord(ch) for ch in name]).generate_state(1)[0]
             % (2 ** 31))


def point(section, name: str, key_data, engine: str, workdir: str | None
          ) -> tuple[dict[str, Any], int]:
  """(metrics, canaries) of one setting of the `flower_audit.torch` section."""
  s = section.settings[name]
  cfg = run_config(**{
      'num-server-rounds': int(section.num_rounds), 'batch-size': int(section.batch_size),
      'learning-rate': float(section.learning_rate), 'target-delta': float(section.delta),
      'target-epsilon': float(s.target_epsilon), 'plant': str(s.plant),
      'grad-canaries': int(s.grad_canaries), 'input-canaries': int(s.input_canaries),
      'plant-factor': float(s.plant_factor), 'client-dp': str(s.client_dp),
      'client-canaries': int(s.client_canaries), 'client-dp-noise': float(s.client_dp_noise),
      'seed': setting_seed(key_data, name), 'canary-seed': setting_seed(key_data, name + '/c')})
  t0 = time.monotonic()
  wd = None if workdir is None else pathlib.Path(workdir) / 'torch' / name
  rec = run(cfg, int(section.num_nodes), engine, wd)
  m = metrics(rec, float(section.confidence))
  m.update(seconds=time.monotonic() - t0, num_nodes=int(section.num_nodes),
           num_rounds=int(section.num_rounds), grad_canaries=int(s.grad_canaries),
           input_canaries=int(s.input_canaries), target_epsilon=float(s.target_epsilon))
  return m, int(s.grad_canaries) + int(s.input_canaries)


def validate(config) -> None:
  """Checks the `flower_audit.torch` section and the engine (one line naming the field, exit
  2, through `fl_privacy.validate`), before any run."""
  base = 'flower_audit.torch'
  import importlib.util  # pylint: disable=import-outside-toplevel
  missing = [m for m in ('torch', 'opacus') if importlib.util.find_spec(m) is None]
  validate_lib.require(not missing, 'flower_audit.parts',
                       "'torch' only with the torch extra installed (pip install -e "
                       "'.[torch]': torch==2.13.0, opacus==1.6.0)", f"'torch' without {missing}")
  validate_lib.one_of(config, 'flower_audit.engine', ENGINES)
  for f in ('num_nodes', 'num_rounds', 'batch_size'):
    validate_lib.checked(config, f'{base}.{f}', validate_lib.number(1, integer=True))
  validate_lib.checked(config, f'{base}.learning_rate', validate_lib.number(0, low_open=True))
  for f in ('delta', 'confidence'):
    validate_lib.checked(config, f'{base}.{f}', validate_lib.number(
        0.5 if f == 'confidence' else 0, 1, low_open=True, high_open=True))
  settings = config.flower_audit.torch.settings
  validate_lib.require(len(settings) > 0, f'{base}.settings', 'at least one setting',
                       dict(settings))
  canaries = validate_lib.Rule('0 or at least 8 (two canaries a world after the split)',
                               lambda n: int(n) == 0 or int(n) >= 8)
  for name in settings.keys():
    f = f'{base}.settings.{name}'
    validate_lib.one_of(config, f'{f}.plant', PLANTS)
    validate_lib.checked(config, f'{f}.target_epsilon', validate_lib.number(0, low_open=True))
    validate_lib.checked(config, f'{f}.plant_factor', validate_lib.number(0, low_open=True))
    for c in ('grad_canaries', 'input_canaries', 'client_canaries'):
      validate_lib.checked(config, f'{f}.{c}', validate_lib.number(0, integer=True))
      validate_lib.checked(config, f'{f}.{c}', canaries)
    validate_lib.one_of(config, f'{f}.client_dp', CLIENT_DP)
    validate_lib.checked(config, f'{f}.client_dp_noise', validate_lib.number(0, low_open=True))


def plan_points(config, key, workdir: str | None) -> list:
  """The pipeline's points: one per setting of `flower_audit.torch.settings`."""
  import jax  # pylint: disable=import-outside-toplevel
  from fl_privacy.pipelines import base  # pylint: disable=import-outside-toplevel
  section = config.flower_audit.torch
  engine = str(config.flower_audit.get('engine', 'inprocess'))
  key_data = np.asarray(jax.random.key_data(key))
  points = []
  for name, st in section.settings.items():
    params = {'part': 'torch', 'setting': name, 'plant': str(st.plant),
              'target_epsilon': float(st.target_epsilon),
              'grad_canaries': int(st.grad_canaries), 'input_canaries': int(st.input_canaries),
              'plant_factor': float(st.plant_factor), 'client_dp': str(st.client_dp),
              'client_canaries': int(st.client_canaries),
              'client_dp_noise': float(st.client_dp_noise), 'num_nodes': int(section.num_nodes),
              'num_rounds': int(section.num_rounds), 'engine': engine}
    points.append(base.Point(
        params, lambda n=name: point(section, n, key_data, engine, workdir), unit='canaries'))
  return points
