"""Every bad input of docs/inputs.md's table: one line naming the field or file, exit 2, nothing written.

Each row runs the real command in a subprocess (the exit status and the absence of a traceback
are properties of the whole program, not of one function), with a `--workdir` that must not
exist afterwards.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from configs import _base
from experiments import common
from tests.experiments import cli

REPO = pathlib.Path(__file__).resolve().parents[2]


def _npz(tmp_path, name, **arrays):
  path = tmp_path / f'{name}.npz'
  np.savez(path, **arrays)
  return path


def _features(n=60, d=5):
  return np.random.default_rng(0).normal(size=(n, d)).astype(np.float32)


def _labels(n=60):
  return (np.arange(n) % 3).astype(np.int32)


def _images(n=60):
  return np.random.default_rng(0).integers(0, 256, (n, 8, 8), dtype=np.uint8)


def _with_value(x, value):
  x = x.copy()
  x[7, 2] = value
  return x


# (row id, experiment, command-line flags (tmp_path -> list), text the one error line must hold)
ROWS = [
    ('misspelt config argument', 'ami',
     lambda t: ['--config=configs/digits.py:smok'],
     "--config=FILE:smok: must be one of smoke[=True|False], path=FILE, data_dir=DIR"),
    ('mistyped config argument', 'ami',
     lambda t: ['--config=configs/digits.py:smoke=maybe'],
     "--config=FILE:smoke=maybe: must be smoke or smoke=True|False"),
    ('config argument the config does not take', 'toy_game',
     lambda t: ['--config=configs/toy.py:path=x.npz'],
     "--config=FILE:path=x.npz: must be one of smoke[=True|False]"),
    ('config file that does not exist', 'ami',
     lambda t: ['--config=configs/nope.py'],
     "--config=configs/nope.py: must be an existing config file"),
    ('unknown override field', 'ami',
     lambda t: ['--config=configs/digits.py:smoke', '--config.ami.nonexistent=1'],
     "config.ami.nonexistent: must be a field of config.ami"),
    ('unknown override section', 'ami',
     lambda t: ['--config=configs/digits.py:smoke', '--config.nosection.x=1'],
     "config.nosection: must be a section or field of config"),
    ('override of the wrong type', 'ami',
     lambda t: ['--config=configs/digits.py:smoke', '--config.ami.num_trials=abc'],
     "flag --config.ami.num_trials=abc: invalid literal for int()"),
    ('unknown flag', 'ami',
     lambda t: ['--config=configs/digits.py:smoke', '--workdri=x'],
     "Unknown command line flag 'workdri'"),
    ('stray argument', 'ami',
     lambda t: ['--config=configs/digits.py:smoke', 'smoke'],
     "smoke: must be a flag"),
    ('experiment section the config lacks', 'ami',
     lambda t: ['--config=configs/mnist.py'],
     "config.ami: must be present for experiments.ami: configs/mnist.py has no 'ami' section; "
     "configs that carry one: configs/celeba.py, configs/cifar10.py, configs/digits.py, "
     "configs/imagenette.py, configs/npz.py"),
    ('imprint layer with fewer bins than a client has examples', 'reconstruction',
     lambda t: ['--config=configs/digits.py:smoke', '--config.reconstruction.imprint.num_bins=4'],
     'config.reconstruction.imprint.num_bins: must be >= 8, the largest client of the imprint '
     'attack'),
    ('reconstruction model without a dense layer on the input', 'reconstruction',
     lambda t: ['--config=configs/digits.py:smoke',
                '--config.reconstruction.model=flower_cnn'],
     "config.reconstruction.model: must be 'mlp' for the analytic attack"),
    ('unknown imprint statistic', 'reconstruction',
     lambda t: ['--config=configs/digits.py:smoke',
                '--config.reconstruction.imprint.statistic=variance'],
     "config.reconstruction.imprint.statistic: must be one of ('mean',)"),
    ('aggregate-only DP against the reconstruction server', 'reconstruction',
     lambda t: ['--config=configs/digits.py:smoke', '--config.defense.name=central_dp'],
     'config.defense.name: must be a defense that acts against the server of '
     'experiments.reconstruction'),
    ('aggregate-only DP against the server that reads uploads', 'dishonest_mia',
     lambda t: ['--config=configs/digits.py:smoke', '--config.defense.name=central_dp'],
     "config.defense.name: must be a defense that acts against the server of "
     "experiments.dishonest_mia"),
    ('a defense the experiment does not apply', 'fedmia',
     lambda t: ['--config=configs/digits.py:smoke', '--config.defense.name=update_dp'],
     "config.defense.name: must be one of ('none',) for experiments.fedmia"),
    ('a defense the LDP audit would ignore', 'ldp_audit',
     lambda t: ['--config=configs/digits.py:smoke', '--config.defense.name=sparsify'],
     "config.defense.name: must be one of ('none',) for experiments.ldp_audit"),
    ('a gradient defense the AMI game cannot act in', 'ami',
     lambda t: ['--config=configs/digits.py:smoke', '--config.defense.name=dp_sgd'],
     "config.defense.name: must be one of ('none', 'mixup', 'augment', 'sampling') for "
     "experiments.ami"),
    ('an infinite DP target epsilon', 'dishonest_mia',
     lambda t: ['--config=configs/digits.py:smoke', '--config.defense.name=update_dp',
                '--config.defense.target_epsilon=inf'],
     "config.defense.target_epsilon: must be None or a finite number > 0 (got inf)"),
    ('delta outside (0, 1)', 'dishonest_mia',
     lambda t: ['--config=configs/digits.py:smoke', '--config.defense.name=update_dp',
                '--config.defense.delta=1.5'],
     "config.defense.delta: must be a finite number in (0, 1) (got 1.5)"),
    ('workdir that is a file', 'toy_game',
     lambda t: ['--config=configs/toy.py:smoke', f'--workdir={_file(t)}'],
     "must be a folder or a new path (got an existing file)"),
    ('workdir under a file', 'toy_game',
     lambda t: ['--config=configs/toy.py:smoke', f'--workdir={_file(t)}/run'],
     "must be a folder or a new path (got a path under the file"),
    ('npz with object arrays', 'ami',
     lambda t: _npz_flags(_npz(t, 'obj', x=np.array([{'a': 1}] * 60, dtype=object),
                               y=_labels())),
     "array 'x' must be a plain numeric array; got an object (pickled) array"),
    ('npz without usable array names', 'ami',
     lambda t: _npz_flags(_npz(t, 'names', arr_0=_features(), arr_1=_labels())),
     "needs an array named one of ['images', 'x']; it holds ['arr_0', 'arr_1']"),
    ('npz with labels of the wrong length', 'ami',
     lambda t: _npz_flags(_npz(t, 'len', x=_features(), y=_labels(59))),
     "'y' (the labels of 'x') must have shape [60] (one per example), got (59,)"),
    ('npz of images with labels of the wrong length', 'ami',
     lambda t: _npz_flags(_npz(t, 'imglen', images=_images(), labels=_labels(59))),
     "'labels' (the labels of 'images') must have shape [60] (one per example), got (59,)"),
    ('npz with one class', 'ami',
     lambda t: _npz_flags(_npz(t, 'one', x=_features(), y=np.zeros(60, np.int32))),
     "'y' must hold at least 2 classes; got only label 0 in all 60 examples"),
    ('npz whose features square to inf', 'ami',
     lambda t: _npz_flags(_npz(t, 'huge', x=_features() * np.float32(1e30), y=_labels())),
     "'x' must hold features of magnitude <= 1.84e+19 (their float32 square overflows "
     "beyond); 300 values in 60 rows exceed it"),
    ('npz with 3 examples', 'ami',
     lambda t: _npz_flags(_npz(t, 'three', images=_images(3), labels=_labels(3))),
     "three.npz: too small for this run: its 'train' split holds 2 examples; needs at least "
     "42 (ami.num_targets = 2 targets"),
    ('empty npz', 'ami',
     lambda t: _npz_flags(_npz(t, 'empty', images=_images(0), labels=_labels(0))),
     "empty.npz: too small: 'images' holds 0 examples; needs at least 3 (20% are held out "
     "as the test split)"),
    ('a target epsilon no DP baseline can be calibrated to', 'pastel',
     lambda t: ['--config=configs/digits.py:smoke', "--config.pastel.defenses=('none','ldp')",
                '--config.pastel.epsilons=(1e9,)'],
     "config.pastel.epsilons: must be below"),
    ('an infinite PASTEL weight', 'pastel',
     lambda t: ['--config=configs/digits.py:smoke', '--config.pastel.pastel_weights=(1e999,)'],
     "config.pastel.pastel_weights: must be a finite number >= 0 (got (inf,))"),
    ('an infinite weight decay', 'fedmia',
     lambda t: ['--config=configs/digits.py:smoke', '--config.fedmia.weight_decay=inf'],
     "config.fedmia.weight_decay: must be a finite number >= 0 (got inf)"),
    ('more LDP copies than memory holds', 'ami',
     lambda t: ['--config=configs/digits.py:smoke', '--config.ami.copies=1000000000000'],
     "config.ami.copies: must be small enough for the randomized copies (2 targets x "
     "1000000000000 copies x 64 features x 4 bytes) to fit in memory: ~476,837.2 GiB >"),
    ('npz with NaN features', 'ami',
     lambda t: _npz_flags(_npz(t, 'nan', x=_with_value(_features(), np.nan), y=_labels())),
     "'x' must hold finite numbers; 1 NaN/inf values in 1 rows (first row 7)"),
    ('npz with inf features', 'ami',
     lambda t: _npz_flags(_npz(t, 'inf', x=_with_value(_features(), -np.inf), y=_labels())),
     "'x' must hold finite numbers; 1 NaN/inf values in 1 rows (first row 7)"),
    ('file that is not an npz', 'ami',
     lambda t: _npz_flags(_text(t)),
     "must be an .npz archive of named arrays (np.savez)"),
    # Results say what ran (issue 29): each class of input that ran something else, or failed
    # after the results files were opened.
    ('config file that is not Python', 'ami',
     lambda t: [f'--config={_write(t, "notpy.py", "this is not python(")}'],
     "must be a config file: a Python module defining get_config(arg), e.g. configs/digits.py "
     "(got a file Python cannot read: SyntaxError at line 1"),
    ('config file without get_config', 'ami',
     lambda t: ['--config=configs/_ami.py'],
     "--config=configs/_ami.py: must be a config file: a Python module defining get_config(arg)"
     ", e.g. configs/digits.py (got a section module"),
    ('seed beyond 64 bits', 'ami',
     lambda t: ['--config=configs/digits.py:smoke', '--seed=99999999999999999999999'],
     "config.seed: must be an integer in [-2**63, 2**63 - 1] (seeds are int64; or pass --seed)"),
    ('empty workdir', 'toy_game',
     lambda t: ['--config=configs/toy.py:smoke', '--workdir='],
     "--workdir=: must be a folder path; leave the flag out for the default"),
    ('override of the setting the config was built for', 'fedmia',
     lambda t: ['--config=configs/digits.py:smoke', '--config.setting=foo'],
     "config.setting: must be given as --config=FILE:setting=leaky|well_generalising (the "
     "sections are built from it) (got '--config.setting=foo')"),
    ('override of smoke', 'fedmia',
     lambda t: ['--config=configs/digits.py:smoke', '--config.smoke=False'],
     "config.smoke: must be given as --config=FILE:smoke[=True|False] (the sections' sizes are "
     "built from it)"),
    ('file path for data that reads no file', 'duplicates',
     lambda t: ['--config=configs/digits.py:path=x.npz'],
     "--config=FILE:path=x.npz: must be given only with configs/npz.py (the digits data reads "
     "no path)"),
    ('data field the data does not read', 'duplicates',
     lambda t: ['--config=configs/digits.py:smoke', '--config.data.data_dir=/tmp'],
     "config.data.data_dir: must be None for data.name='digits' (read only by mnist,"),
    ('more trials than int32 counts', 'ami',
     lambda t: ['--config=configs/digits.py:smoke', '--config.ami.num_trials=3000000000'],
     "config.ami.num_trials: must be an integer in [2, 2**31 - 1] (trials are counted in int32) "
     "(got 3000000000)"),
    ('an empty sweep', 'ami',
     lambda t: ['--config=configs/digits.py:smoke', '--config.ami.dp_deltas=()'],
     "config.ami.dp_deltas: must be a non-empty sequence, every item in (0.0, 1.0) (got ())"),
    ('extractor weights the extractor does not read', 'ami',
     lambda t: ['--config=configs/digits.py:smoke',
                f'--config.ami.extractor_weights={_file(t)}'],
     "config.ami.extractor_weights: must be '' unless ami.extractor is 'resnet18'"),
    ('extractor weights that are not an npz', 'ami',
     lambda t: _npz_flags(_npz(t, 'img', images=_images(), labels=_labels())) + [
         '--config.ami.extractor=resnet18', f'--config.ami.extractor_weights={_file(t)}'],
     "config.ami.extractor_weights: must be '' or an .npz of ResNet-18 weights (np.savez, no "
     "pickled arrays"),
    ('a DP target epsilon no noise reaches', 'dishonest_mia',
     lambda t: ['--config=configs/digits.py:smoke', '--config.defense.name=update_dp',
                '--config.defense.target_epsilon=1e9'],
     "config.defense.target_epsilon: must be None or below 2.2e+06 for update_dp here"),
    ('RMIA gamma without RMIA', 'fedmia',
     lambda t: ['--config=configs/digits.py:smoke', '--config.fedmia.attacks=fedmia_ii',
                '--config.fedmia.rmia_gamma=5'],
     "config.fedmia.rmia_gamma: must be left at its default: read only by 'rmia', which the "
     "attacks scored do not include"),
    ('a momentum plain SGD does not read', 'fedmia',
     lambda t: ['--config=configs/digits.py:smoke', '--config.fedmia.optimizer=sgd',
                '--config.fedmia.momentum=0.5'],
     "config.fedmia.momentum: must be left at its default: read only by optimizer='momentum' "
     "('sgd' has no heavy-ball momentum)"),
    ('inversion settings without the inversion', 'reconstruction',
     lambda t: ['--config=configs/digits.py:smoke', '--config.reconstruction.attacks=imprint',
                '--config.reconstruction.inversion.steps=500'],
     "config.reconstruction.inversion.steps: must be left at its default: 'inversion' runs at "
     "no point"),
    ('a padding the MLP does not read', 'reconstruction',
     lambda t: ['--config=configs/digits.py:smoke', '--config.reconstruction.padding=VALID'],
     "config.reconstruction.padding: must be left at its default: read only by model "
     "'flower_cnn'"),
    ('a claim too small to calibrate', 'training_audit',
     lambda t: ['--config=configs/digits.py:smoke', '--config.training_audit.epsilons=(0.001,)'],
     "config.training_audit.epsilons: must be claims each defense calibrates to (its "
     "accounted epsilon at least half the claim; dp_sgd (poisson) accounts 0 at 0.001)"),
    ('a model whose convolutions do not fit the images', 'reconstruction',
     lambda t: ['--config=configs/digits.py:smoke', '--config.reconstruction.model=flower_cnn',
                '--config.reconstruction.padding=VALID', "--config.reconstruction.attacks=('imprint',)",
                "--config.reconstruction.defense_attacks=('imprint',)"],
     "config.reconstruction.model: must be a model that takes (8, 8, 1) inputs (padding "
     "'VALID') (got 'flower_cnn')"),
    ('a utility client smaller than its minibatch', 'reconstruction',
     lambda t: ['--config=configs/digits.py:smoke', '--config.reconstruction.utility.examples=4'],
     "config.reconstruction.utility.examples: must be in [center.imprint = 8 (its minibatch), "
     "1338 (the train split less the tuning pool)] (got 4)"),
    ('feature vectors to reconstruct', 'reconstruction',
     lambda t: _npz_flags(_npz(t, 'feat', x=_features(), y=_labels())),
     "config.data.name: must be an image dataset (reconstruction scores and draws images: "
     "PSNR, SSIM on pixels in [0, 1]) (got 'npz, feature vectors of (5,)')"),
    ('an adaptive server without a restore scale to try', 'reconstruction',
     lambda t: ['--config=configs/digits.py:smoke', '--config.reconstruction.adaptive.restore_scales=(0.0,)'],
     'config.reconstruction.adaptive.restore_scales: must be a tuple of finite numbers > 0 (empty: none) (got (0.0,))'),
    ('a negative client learning rate in the sweep', 'reconstruction',
     lambda t: ['--config=configs/digits.py:smoke', '--config.reconstruction.num_batches=(1,2)', '--config.reconstruction.learning_rates=(-1.0,)'],
     'config.reconstruction.learning_rates: must be a tuple of finite numbers > 0 (empty: none) (got (-1.0,))'),
    ('epsilons without an LDP mechanism', 'ami',
     lambda t: ['--config=configs/digits.py:smoke', "--config.ami.mechanisms=('none',)", '--config.ami.epsilons=(2.0,)'],
     'config.ami.epsilons: must be left at its default: read only under an LDP mechanism (bitrand, ome), which ami.mechanisms does not include'),
    ('a duplicates field in the MIA run', 'dishonest_mia',
     lambda t: ['--config=configs/digits.py:smoke', '--config.dishonest.near_threshold=0.5'],
     'config.dishonest.near_threshold: must be left at its default: read only by experiments.duplicates'),
    ('an MIA field in the duplicates search', 'duplicates',
     lambda t: ['--config=configs/digits.py:smoke', '--config.dishonest.runs=8'],
     'config.dishonest.runs: must be left at its default: read only by experiments.dishonest_mia'),
    ('DP settings without a DP baseline', 'pastel',
     lambda t: ['--config=configs/digits.py:smoke', "--config.pastel.defenses=('none','pastel')", '--config.pastel.dp_delta=1e-6'],
     'config.pastel.dp_delta: must be left at its default: read only by the DP baselines (wdp, ldp, cdp), which pastel.defenses does not include'),
    ('a DP-SGD field without DP-SGD', 'dp_audit',
     lambda t: ['--config=configs/digits.py:smoke', "--config.dp_audit.mechanisms=('gaussian',)", '--config.dp_audit.epochs=3'],
     'config.dp_audit.epochs: must be left at its default: read only by dp_audit.mechanisms dp_sgd_poisson or dp_sgd_shuffle, which this run does not audit'),
    ("a part's field when the part does not run", 'flower_audit',
     lambda t: ['--config=configs/digits.py:smoke', '--config.flower_audit.reconstruction.num_nodes=8'],
     "config.flower_audit.reconstruction.num_nodes: must be left at its default: read only by the 'reconstruction' part, which flower_audit.parts does not run"),
    ('an unknown Flower engine', 'flower_audit',
     lambda t: ['--config=configs/digits.py:smoke', '--config.flower_audit.engine=ray'],
     "config.flower_audit.engine: must be one of ('inprocess', 'simulation', 'deployment') (got 'ray')"),
    ('more nodes than a local deployment holds', 'flower_audit',
     lambda t: ['--config=configs/digits.py:smoke', '--config.flower_audit.engine=deployment',
                "--config.flower_audit.parts=('fedmia',)", '--config.flower_audit.num_clients=100000'],
     "config.flower_audit.num_clients: must be at most"),
    ('the engine with only the DP games', 'flower_audit',
     lambda t: ['--config=configs/digits.py:smoke', "--config.flower_audit.parts=('dp',)",
                '--config.flower_audit.engine=simulation'],
     "config.flower_audit.engine: must be left at its default: read only by the parts that deploy Flower"),
    ('a batch larger than the data', 'fedmia',
     lambda t: ['--config=configs/digits.py:smoke', '--config.fedmia.batch_size=100000'],
     "config.fedmia.batch_size: must be <= 1438, the training examples the clients share"),
    ('a batch larger than the shard', 'fedmia',
     lambda t: ['--config=configs/digits.py:smoke', '--config.fedmia.per_client=4',
                '--config.fedmia.batch_size=32'],
     "config.fedmia.batch_size: must be <= fedmia.per_client = 4 (each client's shard"),
    ('npz with a huge label', 'ami',
     lambda t: _npz_flags(_npz(t, 'label', images=_images(), labels=_huge_label())),
     "'labels' (the labels of 'images') must be < 100,000 (class indices size the models' "
     "outputs); got 1000000000"),
    ('npz with a huge num_classes', 'ami',
     lambda t: _npz_flags(_npz(t, 'classes', images=_images(), labels=_labels(),
                               num_classes=np.int64(10**9))),
     "num_classes must be at most 100,000 (it sizes the models' outputs and one-hot labels); "
     "got 1000000000"),
    ('npz of images without channels', 'ami',
     lambda t: _npz_flags(_npz(t, 'nochan', images=np.zeros((60, 8, 8, 0), np.uint8),
                               labels=_labels())),
     "'images' must hold images of positive height, width and channels; got shape "
     "(60, 8, 8, 0)"),
    ('npz of 1x1 images for the dishonest server', 'dishonest_mia',
     lambda t: _npz_flags(_npz(t, 'tiny', images=_images(300)[:, :1, :1],
                               labels=_labels(300))),
     "config.data: must be images of at least 4x4 for the dishonest server's trunk"),
    ('a violation flagged below 95%', 'ldp_audit',
     lambda t: ['--config=configs/digits.py:smoke',
                '--config.ldp_audit.violation_confidence=0.3'],
     "config.ldp_audit.violation_confidence: must be None or a finite number in [0.95, 1)"),
    ('more crafter candidates than the split holds', 'ldp_audit',
     lambda t: ['--config=configs/digits.py:smoke', '--config.ldp_audit.candidates=100000'],
     "config.ldp_audit.candidates: must be <= 1438, the examples of the 'train' split it "
     "screens (got 100000)"),
    ('fixed-point format out of range', 'ldp_audit',
     lambda t: ['--config=configs/digits.py:smoke', '--config.ldp_audit.mechanism=bitrand',
                '--config.ldp_audit.int_bits=40'],
     "config.ldp_audit.int_bits: must be such that 1 <= int_bits + frac_bits <= "),
    ('override of a field the run does not read', 'ldp_audit',
     lambda t: ['--config=configs/digits.py:smoke', '--config.ldp_audit.int_bits=40'],
     "config.ldp_audit.int_bits: must be left at its default: read only by "
     "ldp_audit.mechanism bitrand or ome; this run audits 'ldp_sgd'"),
    ('a defense section the experiment does not run', 'fedmia',
     lambda t: ['--config=configs/digits.py:smoke', '--config.defense.clip_norm=2.0'],
     'config.defense.clip_norm: must be left at its default: experiments.fedmia runs no '
     'defense of the defense section'),
    ('a field of a defense other than the one named', 'reconstruction',
     lambda t: ['--config=configs/digits.py:smoke', '--config.defense.name=update_noise',
                '--config.defense.clip_norm=2.0'],
     "config.defense.clip_norm: must be left at its default: read only by other defenses "
     "(defense.name is 'update_noise', which reads sigma)"),
    # A newcomer's inputs (issue 41): sizes that reached an allocation, values no point ran.
    ('a client minibatch larger than its rows', 'training_audit',
     lambda t: ['--config=configs/digits.py:smoke', '--config.training_audit.client.batch_size=10'],
     "config.training_audit.client.batch_size: must be at most client.per_client (1)"),
    ('more clients than rows', 'training_audit',
     lambda t: ['--config=configs/digits.py:smoke',
                '--config.training_audit.record.num_clients=100000'],
     "config.training_audit.record.num_clients: must be at most 1438"),
    ('canary trainings larger than memory', 'training_audit',
     lambda t: ['--config=configs/digits.py:smoke', '--config.training_audit.chunk=4096',
                '--config.training_audit.record.canaries=1000000',
                "--config.training_audit.record.hidden=(4096,4096)"],
     "config.training_audit.record.hidden: must be small enough for the clients' updates "
     "(4096 trainings a chunk (training_audit.chunk) x 10 clients x 17,088,522 parameters x 4 "
     "bytes) to fit in memory"),
    ('more side-channel clients than rows', 'training_audit',
     lambda t: ['--config=configs/digits.py:smoke', "--config.training_audit.defenses=('central_dp',)",
                '--config.training_audit.side_channel_others=1000',
                '--config.training_audit.client.per_client=2',
                '--config.training_audit.client.num_clients=10'],
     "config.training_audit.side_channel_others: must be at most 717"),
    ('the trial runner\'s fields in the training audit', 'training_audit',
     lambda t: ['--config=configs/digits.py:smoke', '--config.game.chunk_size=4'],
     "config.game.chunk_size: must be left at its default: read only by the trial runner of "
     "the other games"),
    ('canary counts without a canary threat', 'training_audit',
     lambda t: ['--config=configs/digits.py:smoke', "--config.training_audit.threats=('side_channel',)",
                '--config.training_audit.record.canaries=300'],
     "config.training_audit.record.canaries: must be left at its default: read only by the "
     "canaries' trainings, which no threat of training_audit.threats scores"),
    ('an imprint layer larger than memory', 'reconstruction',
     lambda t: ['--config=configs/digits.py:smoke',
                '--config.reconstruction.imprint.num_bins=1000000000'],
     "config.reconstruction.imprint.num_bins: must be small enough for the crafted layer (64 "
     "inputs x 1,000,000,000 bins x 4 bytes) to fit in memory"),
    ('more reconstruction trials than memory holds', 'reconstruction',
     lambda t: ['--config=configs/digits.py:smoke', '--config.reconstruction.trials=1000000000'],
     "config.reconstruction.trials: must be small enough for a point's recovered rows "
     "(1,000,000,000 trials x 256 rows of imprint x 64 inputs x 4 bytes) to fit in memory"),
    ('more bootstrap resamples than memory holds', 'reconstruction',
     lambda t: ['--config=configs/digits.py:smoke',
                '--config.reconstruction.bootstrap_resamples=1000000000'],
     "config.reconstruction.bootstrap_resamples: must be small enough for the bootstrap's "
     "indices"),
    ('an honest model larger than memory', 'reconstruction',
     lambda t: ['--config=configs/digits.py:smoke', '--config.reconstruction.hidden=(3000000000,)'],
     "config.reconstruction.hidden: must be small enough for the honest model "
     "(225,000,000,010 parameters x 4 bytes) to fit in memory"),
    ('a batch size no attack runs', 'reconstruction',
     lambda t: ['--config=configs/digits.py:smoke', '--config.reconstruction.batch_sizes=(128,)'],
     "config.reconstruction.batch_sizes: must be sizes some attack runs: each at most the "
     "largest max_examples (64; a larger client runs at no point) (got (128,))"),
    ('batch sizes the chosen attack never runs', 'reconstruction',
     lambda t: ['--config=configs/digits.py:smoke', "--config.reconstruction.attacks=('inversion',)",
                '--config.reconstruction.batch_sizes=(8,)'],
     "config.reconstruction.batch_sizes: must be sizes the chosen attacks run (at least one <= "
     "1, the largest max_examples of reconstruction.attacks; else no batch-size point runs) "
     "(got (8,))"),
    ('a J no multi-step attack runs', 'reconstruction',
     lambda t: ['--config=configs/digits.py:smoke', '--config.reconstruction.num_batches=(1000,)'],
     "config.reconstruction.num_batches: must be J some multi-step attack runs"),
    ('a PSNR threshold above the cap', 'reconstruction',
     lambda t: ['--config=configs/digits.py:smoke', '--config.reconstruction.psnr_threshold=1000.0'],
     "config.reconstruction.psnr_threshold: must be below 200 dB (PSNRs are capped there"),
    ('more grid images than any client holds', 'reconstruction',
     lambda t: ['--config=configs/digits.py:smoke', '--config.reconstruction.grid_images=1000'],
     "config.reconstruction.grid_images: must be at most 64, the largest max_examples"),
    ('centre sizes no sweep reads', 'reconstruction',
     lambda t: ['--config=configs/digits.py:smoke', '--config.reconstruction.defenses.update_dp=()',
                '--config.reconstruction.multi_step_attacks=()',
                '--config.reconstruction.center.num_batches=2'],
     "config.reconstruction.center.num_batches: must be left at its default: read only by the "
     "J and E sweeps and the defense sweep"),
    ('a CelebA attribute on other data', 'ami',
     lambda t: ['--config=configs/digits.py:smoke', '--config.data.attribute=Male'],
     "config.data.attribute: must be left at its default: read only by data.name='celeb_a' "
     "(the data is 'digits')"),
    ('images resized beyond memory', 'ami',
     lambda t: ['--config=configs/digits.py:smoke', '--config.data.image_size=100000'],
     "config.data.image_size: must be small enough for the resized images (1,438 images x "
     "100000^2 pixels x 1 channels x 5 bytes: uint8 and float32) to fit in memory"),
    ("a momentum the dishonest client's plain SGD does not read", 'dishonest_mia',
     lambda t: ['--config=configs/digits.py:smoke', "--config.dishonest.optimizers=('sgd',)",
                '--config.dishonest.momentum=0.5'],
     "config.dishonest.momentum: must be left at its default: read only by optimizer "
     "'momentum' (not in ('sgd',); 'sgd' is plain SGD, without heavy-ball momentum)"),
    ('the same split twice', 'duplicates',
     lambda t: ['--config=configs/digits.py:smoke',
                "--config.dishonest.duplicate_splits=('train','train')"],
     "config.dishonest.duplicate_splits: must be distinct splits of ('train', 'test', "
     "'validation') (got ('train', 'train'))"),
]


def _huge_label():
  y = _labels().astype(np.int64)
  y[7] = 10**9
  return y


def _write(tmp_path, name, text):
  path = tmp_path / name
  path.write_text(text)
  return path


def _file(tmp_path):
  path = tmp_path / 'a_file'
  path.write_text('not a folder')
  return path


def _text(tmp_path):
  path = tmp_path / 'text.npz'
  path.write_text('hello')
  return path


def _npz_flags(path):
  return [f'--config=configs/npz.py:path={path},smoke']


def _run(experiment, flags, cwd=REPO):
  env = cli.env(JAX_PLATFORMS='cpu')
  return subprocess.run([sys.executable, '-m', f'experiments.{experiment}', *flags],
                        cwd=cwd, env=env, capture_output=True, text=True, timeout=180)


@pytest.fixture(scope='module')
def server():
  # The rows run in forks of one interpreter that imported the library once (the test
  # process's fork server, shared with the other files' refusals); one real subprocess per
  # experiment below checks what a fork cannot (import-time output).
  return cli.forked_client()


@pytest.mark.parametrize('row,experiment,make_flags,needle', ROWS, ids=[r[0] for r in ROWS])
def test_bad_input_exits_2_with_one_line_and_writes_nothing(tmp_path, server, row, experiment,
                                                            make_flags, needle):
  del row
  flags = make_flags(tmp_path)
  if not any(f.startswith('--workdir') for f in flags):
    flags.append(f'--workdir={tmp_path / "never"}')
  proc = server.run(experiment, flags, cwd=REPO, env=cli.env(JAX_PLATFORMS='cpu'))
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert 'Traceback' not in proc.stderr
  # The error is the only line: no INFO lines or JAX backend probing before it.
  errors = proc.stderr.splitlines()
  assert len(errors) == 1 and errors[0].startswith('error:'), proc.stderr[-2000:]
  assert needle in errors[0], errors[0]
  assert not (tmp_path / 'never').exists()
  assert not (tmp_path / 'a_file' / 'run').exists()


# One field each experiment checks while it prepares (after JAX and the compile cache started).
_BAD_FIELD = {
    'ami': ('--config.ami.num_trials=1', 'config.ami.num_trials'),
    'dishonest_mia': ('--config.dishonest.momentum=1.5', 'config.dishonest.momentum'),
    'dp_audit': ('--config.dp_audit.delta=2.0', 'config.dp_audit.delta'),
    'duplicates': ('--config.dishonest.near_threshold=inf', 'config.dishonest.near_threshold'),
    'fedmia': ('--config.fedmia.weight_decay=inf', 'config.fedmia.weight_decay'),
    'ldp_audit': ('--config.ldp_audit.clip_norm=-1.0', 'config.ldp_audit.clip_norm'),
    'pastel': ('--config.pastel.pastel_weights=(1e999,)', 'config.pastel.pastel_weights'),
    'toy_game': ('--config.toy.p=(1.5,)', 'config.toy.p'),
    'flower_audit': ('--config.flower_audit.num_clients=1', 'config.flower_audit.num_clients'),
    'reconstruction': ('--config.reconstruction.psnr_threshold=-1.0',
                       'config.reconstruction.psnr_threshold'),
    'training_audit': ('--config.training_audit.record.per_client=100000',
                       'config.training_audit.record.per_client'),
    'dp_bugs': ('--config.dp_bugs.seeds=0', 'config.dp_bugs.seeds'),
}


@pytest.mark.parametrize('experiment', sorted(common.SECTIONS))
def test_every_experiment_prints_only_the_error_line(tmp_path, experiment):
  flag, field = _BAD_FIELD[experiment]
  config = 'configs/toy.py:smoke' if experiment == 'toy_game' else 'configs/digits.py:smoke'
  proc = _run(experiment, [f'--config={config}', flag, f'--workdir={tmp_path / "never"}'])
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert len(proc.stderr.splitlines()) == 1, proc.stderr[-2000:]
  assert proc.stderr.startswith(f'error: {field}: must be '), proc.stderr
  assert not (tmp_path / 'never').exists()


def test_every_row_is_in_docs_inputs_md():
  # The table in docs/inputs.md (moved there from BUILD.md) quotes each message; keep it true.
  text = (REPO / 'docs' / 'inputs.md').read_text()
  for row, _, _, needle in ROWS:
    assert row in text, row
    assert needle.replace('|', r'\|') in text, row


def test_workdir_that_cannot_be_written(tmp_path, monkeypatch):
  # As root every folder is writable, so read-only-ness is simulated where it is looked up.
  real_access = os.access
  ro = str(tmp_path / 'ro')
  os.mkdir(ro)
  monkeypatch.setattr(os, 'access', lambda p, m: False if str(p) == ro else real_access(p, m))
  assert 'got a read-only folder' in common.check_workdir(ro)
  assert 'under the read-only folder' in common.check_workdir(os.path.join(ro, 'a', 'b'))
  assert common.check_workdir(str(tmp_path / 'new' / 'run')) is None
  assert not (tmp_path / 'new').exists()


@pytest.mark.skipif(os.access('/proc/sys', os.W_OK), reason='/proc/sys is writable here')
def test_workdir_on_a_read_only_filesystem(tmp_path):
  proc = _run('toy_game', ['--config=configs/toy.py:smoke', '--workdir=/proc/sys/fl_run'])
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert 'must be a folder that can be created' in proc.stderr


def test_smoke_false_is_false_and_smoke_is_true():
  from configs import digits
  assert digits.get_config('smoke=False').smoke is False
  assert digits.get_config('smoke=false').game.chunk_size == digits.get_config().game.chunk_size
  assert digits.get_config('smoke').smoke is True
  assert digits.get_config('smoke=True').smoke is True
  assert _base.parse_arg('path=/a.npz,smoke=0') == {'path': '/a.npz', 'smoke': False}
  for bad in ('smok', 'smoke=2', 'path', 'path=', 'smoke,smoke', 'data_dir'):
    with pytest.raises(_base.ConfigArgError):
      _base.parse_arg(bad)


def test_help_lists_the_flags_and_the_config_fields():
  proc = _run('ami', ['--help'])
  assert proc.returncode == 0, proc.stderr[-2000:]
  for text in ('--config=FILE[:ARGS]', '--workdir=DIR', '--seed=N', '--config.ami.FIELD=VALUE',
               'configs/_ami.py', 'smoke[=True|False]'):
    assert text in proc.stdout, text


def test_side_channel_trials_are_bounded_by_memory(monkeypatch):
  # The bound depends on the machine's memory (the config caps trials at 10^6, within the
  # memory of a large machine): checked with the memory pinned at 1 GiB.
  from configs import digits  # pylint: disable=g-import-not-at-top
  from fl_privacy import memory  # pylint: disable=g-import-not-at-top
  from fl_privacy import validate  # pylint: disable=g-import-not-at-top
  from fl_privacy.pipelines import training_audit_checks  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(memory, 'device_memory', lambda: (2**30, 'a 1 GiB test budget'))
  config = digits.get_config('smoke')
  s = config.training_audit
  tr = dict(defense='central_dp', sampling='none', claimed_epsilon=2.0, canary='side_channel')
  check = training_audit_checks.side_channel
  # 1438 rows x 20 bytes a row: 1 GiB holds 37,338 trials.
  s.side_channel_trials = 37_000
  check(config, tr, 1438, 'aggregate')
  s.side_channel_trials = 38_000
  with pytest.raises(validate.ConfigError, match=r'config.training_audit.side_channel_trials: '
                     r'must be small enough for the per-trial draws \(38000 trials x a '
                     r'permutation of 1438 rows'):
    check(config, tr, 1438, 'aggregate')
  # The aggregate's reader sees the other clients' rows too: 1 + 2 + k x 1 <= 1438.
  s.side_channel_trials, s.side_channel_others = 1000, 1435
  check(config, tr, 1438, 'aggregate')
  check(config, tr, 1438, 'server')   # the server sees the target alone
  s.side_channel_others = 1436
  with pytest.raises(validate.ConfigError, match='side_channel_others: must be at most 1435'):
    check(config, tr, 1438, 'aggregate')
