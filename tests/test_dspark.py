"""DSpark: greedy output equals AR under every schedule (batch 1 and 4, rows that finish
early), the budget is a function of the confidences alone, the load-aware scheduler admits
in descending survival, the cached walk equals a cache-free reference, and training lowers
the confidence head's calibration error and (with the Markov head) raises late-position
acceptance."""

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from conftest import train_block_drafter
from decoding_helpers import random_prompts, run_ar, run_spec, tiny_model, to_lists
from specjax.decoding import schedule
from specjax.drafters.dspark import DSparkDrafter, dspark_model, markov_walk
from specjax.errors import SpecjaxError
from specjax.sampling import Sampler

VOCAB = 61
LAYERS = (1, 2)
K = 5


def spread(params, seed=3):
  """Random Markov transition and confidence head, so the walk and the budgets vary."""
  rng = np.random.default_rng(seed)
  params = jax.tree.map(lambda x: x, params)
  params["markov_head"]["markov_w2"][...] = rng.normal(
      0, 0.3, params["markov_head"]["markov_w2"][...].shape)
  params["confidence_head"]["w"][...] = rng.normal(
      0, 0.5, params["confidence_head"]["w"][...].shape)
  params["confidence_head"]["b"][...] = jnp.float32(1.5)
  return params


@pytest.fixture(scope="module")
def setup():
  g, p = tiny_model(VOCAB, seed=0)
  cfg = nnx.merge(g, p).cfg
  dg, dp = nnx.split(dspark_model(cfg, 2, len(LAYERS), 8, rngs=nnx.Rngs(5)), nnx.Param)
  return (g, p), (dg, spread(dp))


def drafter(dg, sched="fixed", k=K, **kw):
  widths = (0, 2, k)  # three compiled verify passes keep the test's compile time down
  seconds = tuple(1.0 + 0.05 * w for w in widths)  # cheap enough that some drafts pay
  return DSparkDrafter(k, graphdef=dg, target_feature_layers=LAYERS, schedule=sched,
                       threshold=kw.pop("threshold", 0.4), widths=widths,
                       width_seconds=seconds, **kw)


@pytest.mark.parametrize("sched", ["fixed", "threshold", "load_aware"])
@pytest.mark.parametrize("batch", [1, 4])
def test_greedy_dspark_equals_ar_every_schedule(setup, sched, batch):
  (g, p), (dg, dp) = setup
  prompts = random_prompts(8, VOCAB, seed=batch)
  # EOS = a token row 0 emits early: rows finish at different steps
  eos = to_lists(run_ar(g, p, prompts[:1], 24, eos=-1), -1)[0][4]
  d = drafter(dg, sched)
  lengths, budgets, widths = [], 0, 0
  for i in range(0, 8, batch):
    chunk = prompts[i:i + batch]
    ref = to_lists(run_ar(g, p, chunk, 24, eos=eos), eos)
    got = run_spec(g, p, d, dp, chunk, 24, eos=eos)
    assert to_lists(got, eos) == ref
    lengths += [len(r) for r in ref]
    if sched != "fixed":
      budgets = budgets + np.asarray(got.budget_counts)
      widths = widths + np.asarray(got.width_counts)
      reached, accepted = np.asarray(got.position_counts)
      assert (accepted <= reached).all()
  if sched == "threshold" and batch == 4:
    assert (np.asarray(budgets) > 0).sum() >= 2  # several budget values were used
    assert widths[K] < widths.sum()  # some steps verified fewer than K drafts
  assert min(lengths) < 24 and max(lengths) == 24  # some rows finished early, some did not


@dataclasses.dataclass(frozen=True)
class OracleDrafts(DSparkDrafter):
  """The same proposal and confidences, with the drafts replaced by the target's own
  continuation (`oracle`, one row per prompt): verification then accepts them."""
  oracle: tuple = ()

  def propose(self, params, target, state, ctx, sampler, rng):
    _, q, state = super().propose(params, target, state, ctx, sampler, rng)
    return jnp.asarray(self.oracle, jnp.int32), q, state


@pytest.mark.parametrize("sched", ["threshold", "load_aware"])
def test_budget_is_a_function_of_confidences_alone(setup, sched):
  """One loop step with the drafts perturbed (so verification accepts something else) and
  the confidences kept: the budgets the loop used are the same; other confidences change
  them."""
  (g, p), (dg, dp) = setup
  prompts = random_prompts(4, VOCAB, seed=11)
  d = drafter(dg, sched)
  ar = to_lists(run_ar(g, p, prompts, K + 1, eos=-1), -1)
  shifted = OracleDrafts(**{f.name: getattr(d, f.name) for f in dataclasses.fields(d)},
                         oracle=tuple(tuple(r[1:K + 1]) for r in ar))
  a = run_spec(g, p, d, dp, prompts, 2, eos=-1)  # max_new 2: exactly one draft-verify step
  b = run_spec(g, p, shifted, dp, prompts, 2, eos=-1)
  assert int(a.target_calls) == int(b.target_calls) == 2
  assert not np.array_equal(a.position_counts, b.position_counts)  # verification differed
  np.testing.assert_array_equal(a.budget_counts, b.budget_counts)
  np.testing.assert_array_equal(a.width_counts, b.width_counts)
  from specjax.drafters.dspark import DSparkState
  conf = jnp.full((4, K), 0.99, jnp.float32)
  active = jnp.ones((4,), bool)
  assert not np.array_equal(d.verify_budget(dp, DSparkState((), conf), active),
                            d.verify_budget(dp, DSparkState((), conf * 0.2), active))


def test_load_aware_admits_in_descending_survival_and_shrinks_with_batch():
  a = jnp.asarray([[0.9, 0.8, 0.5, 0.2], [0.95, 0.6, 0.3, 0.1]], jnp.float32)
  free = (1.0,) * 5  # verification costs nothing more per token: admit everything positive
  assert schedule.load_aware_budget(a, jnp.array([True, True]), free).tolist() == [4, 4]
  steep = (1.0, 1.5, 2.0, 2.5, 3.0)
  got = schedule.load_aware_budget(a, jnp.array([True, True]), steep).tolist()
  assert got[0] >= got[1]  # row 0's survival is higher past position 1
  assert schedule.load_aware_budget(a, jnp.array([True, False]), steep)[1] == 0
  # a bigger batch makes each width step cost more against the same per-row gain
  one = schedule.load_aware_budget(a[:1], jnp.array([True]), (1.0, 1.1, 1.2, 1.3, 1.4))
  many = schedule.load_aware_budget(jnp.tile(a[:1], (8, 1)), jnp.ones((8,), bool),
                                    (1.0, 1.8, 2.6, 3.4, 4.2))
  assert int(many.max()) < int(one[0])
  # the drafter's own step is paid whatever the budget: a costly one makes drafts worth more.
  # One row, survival 0.5, T(0) = 1, T(1) = 2: 1/1 > 1.5/2 refuses, 1/3 < 1.5/4 admits.
  half, row = jnp.asarray([[0.5]]), jnp.array([True])
  assert schedule.load_aware_budget(half, row, (1.0, 2.0)).tolist() == [0]
  assert schedule.load_aware_budget(half, row, (1.0, 2.0), draft_seconds=2.0).tolist() == [1]
  # the survival used is non-increasing in j whatever the calibration temperatures
  s = schedule.survival(jnp.asarray([[0.9, 0.99, 0.99]]), (0.5, 3.0, 0.2))
  assert (np.diff(np.asarray(s)) <= 1e-7).all()


def test_bad_schedule_is_one_line_error(setup):
  (_, _), (dg, _) = setup
  with pytest.raises(SpecjaxError, match="unknown schedule"):
    drafter(dg, "sometimes")
  with pytest.raises(SpecjaxError, match=r"threshold must be in \(0, 1\)"):
    drafter(dg, "threshold", threshold=1.5)
  with pytest.raises(SpecjaxError, match="one measured cost per verify width"):
    DSparkDrafter(K, graphdef=dg, target_feature_layers=LAYERS, schedule="load_aware")


def test_walk_equals_stepwise_reference(setup):
  """The scanned walk: each slot's logits are U_j + W2 W1[x_{j-1}] with x_{j-1} the draft
  it just made, at T=0 (argmax) and T>0 (q is the processed distribution the draft came
  from)."""
  (g, p), (dg, dp) = setup
  model = nnx.merge(dg, dp)
  rng = np.random.default_rng(1)
  base = jnp.asarray(rng.normal(0, 2, (3, K, VOCAB)), jnp.float32)
  hidden = jnp.asarray(rng.normal(0, 1, (3, K, 32)), jnp.float32)
  anchor = jnp.asarray([3, 7, 11])
  markov = dp["markov_head"]
  w1, w2 = np.asarray(markov["markov_w1"][...]), np.asarray(markov["markov_w2"][...])
  for sampler in (Sampler(), Sampler(0.8, top_k=10)):
    drafts, q, conf = markov_walk(model, base, hidden, anchor, sampler, jax.random.key(0))
    prev = np.asarray(anchor)
    for j in range(K):
      logits = np.asarray(base[:, j]) + w1[prev] @ w2
      if sampler.greedy:
        np.testing.assert_array_equal(drafts[:, j], logits.argmax(-1))
      else:
        np.testing.assert_allclose(q[:, j], sampler.probs(jnp.asarray(logits)), atol=1e-5)
        assert (np.asarray(q[:, j])[np.arange(3), np.asarray(drafts[:, j])] > 0).all()
      prev = np.asarray(drafts[:, j])
    assert conf.shape == (3, K) and ((conf > 0) & (conf < 1)).all()


def train_variant(tiny_run, corpus, tfds_dir, root, markov_rank):
  run = train_block_drafter(tiny_run, "dspark_tiny.py", root / f"rank{markov_rank}", corpus,
                            tfds_dir, num_steps=100, log_every=50, eval_every=50,
                            save_every=100, block_size=6, gamma=4.0, markov_rank=markov_rank)
  with open(os.path.join(run, "dspark", "metrics.jsonl")) as f:
    return str(run), [json.loads(l) for l in f if '"val_loss"' in l]


@pytest.fixture(scope="module")
def trained(tiny_run, template_corpus_dir, tfds_dir, tmp_path_factory):
  """The same backbone, steps and data with and without the Markov head."""
  root = tmp_path_factory.mktemp("dspark_runs")
  return {r: train_variant(tiny_run, template_corpus_dir, tfds_dir, root, r) for r in (16, 0)}


def test_training_lowers_loss_and_calibration_error(trained):
  run, rows = trained[16]
  first, last = rows[0], rows[-1]
  assert first["step"] == 0 and last["step"] == 100
  assert last["val_loss"] < first["val_loss"] - 0.5
  # |c_j - (1 - TV_j)| on held-out blocks, and the survival's ECE before/after calibration
  assert last["val_confidence_error"] < 0.5 * first["val_confidence_error"]
  with open(os.path.join(run, "dspark", "calibration.json")) as f:
    cal = json.load(f)
  assert len(cal["temperatures"]) == 6 and cal["ece_after"] <= cal["ece_before"] + 1e-6


def test_markov_head_raises_late_position_acceptance(trained):
  with_markov, without = trained[16][1][-1], trained[0][1][-1]
  assert with_markov["val_accept_late"] > without["val_accept_late"] + 0.02
  assert with_markov["val_acc_late"] > without["val_acc_late"]


def test_trained_dspark_through_the_harness(trained, tmp_path):
  from specjax import evaluate
  from test_decode import decode_config
  run = trained[16][0]
  prompts = tmp_path / "template_prompts.jsonl"
  prompts.write_text("".join(
      json.dumps({"prompt": f"def {n}_{a}{b}(x):\n    return x * {a} + {b}\n\ndef {m}_"}) + "\n"
      for n, m, a, b in [("alpha", "beta", 1, 2), ("gamma", "delta", 3, 4)]))
  cfg = decode_config(run, tmp_path, methods="dspark", block_size=6, prompts=str(prompts),
                      max_new_tokens=16, dspark={"schedule": "load_aware"},
                      measure_costs=False)
  report = evaluate.evaluate(cfg)["methods"]["dspark"]
  assert report["lossless_check"] is True and report["schedule"] == "load_aware"
  assert len(report["mean_confidence_per_position"]) == 5
  assert sum(report["budget_histogram"]) > 0 and len(report["verify_width_seconds"]) >= 3


def test_dspark_builds_the_same_backbone_as_dflash_from_its_config():
  """mask_token_id and layer_shape (the real-scale DSpark configs set both) reach DSpark's
  backbone as they reach DFlash's: the mask slots are the target's token embedding, not a
  learned vector, and the layers take the configured shape."""
  import ml_collections
  from specjax.drafters import dflash, dspark
  g, p = tiny_model(61, seed=0)
  target_cfg = nnx.merge(g, p).cfg
  cfg = ml_collections.ConfigDict(dict(num_layers=1, feature_layers=[1, 2], markov_rank=4,
                                       mask_token_id=60, layer_shape={"mlp_dim": 24}))
  for build in (dflash.build_model, dspark.build_model):
    model = nnx.eval_shape(lambda: build(cfg, target_cfg, nnx.Rngs(0)))
    assert model.mask_token_id == 60 and not hasattr(model, "mask_embedding"), build
    assert model.layer_cfg.mlp_dim == 24, build
  cfg.mask_token_id = 61
  with pytest.raises(SpecjaxError, match="mask_token_id=61 outside"):
    dspark.build_model(cfg, target_cfg, nnx.Rngs(0))


def test_checkpoint_from_before_the_heads_were_modules_still_decodes(trained, tmp_path):
  """A DSpark checkpoint saved with the heads' parameters on the model itself (markov_w1,
  confidence_w, ...; before the block backbone took heads) loads with them renamed, every
  value where it was, and a checkpoint that matches neither layout is still a one-line
  error."""
  import shutil
  from flax.traverse_util import flatten_dict, unflatten_dict
  from specjax import run_dir
  from specjax.checkpoint import Checkpoints
  from specjax.methods import builtin
  from specjax.drafters.dspark import LEGACY_PATHS
  run = trained[16][0]
  target = run_dir.load_target(run)
  _, params, _, _ = builtin.load_dspark(run, target, 5)
  new_to_old = {new: old for old, new in LEGACY_PATHS.items()}
  legacy = {}
  for path, value in flatten_dict(nnx.to_pure_dict(params)).items():
    path = tuple(str(p) for p in path)
    for new, old in new_to_old.items():
      if path[:len(new)] == new:
        path = old + path[len(new):]
    legacy[path + ("value",)] = np.asarray(value)
  assert ("markov_w1", "value") in legacy and ("confidence_b", "value") in legacy
  old_run = tmp_path / "old"
  shutil.copytree(os.path.join(run, "target"), old_run / "target")
  os.makedirs(old_run / "dspark")
  shutil.copy(os.path.join(run, "dspark", "config.json"), old_run / "dspark")
  ckpt = Checkpoints(str(old_run / "dspark" / "checkpoints"))
  ckpt.save(1, unflatten_dict(legacy), {"step": np.int32(1)})
  ckpt.wait()
  ckpt.close()
  _, loaded, _, _ = builtin.load_dspark(str(old_run), target, 5)
  want, got = flatten_dict(nnx.to_pure_dict(params)), flatten_dict(nnx.to_pure_dict(loaded))
  assert set(want) == set(got)
  for path in want:
    np.testing.assert_array_equal(np.asarray(got[path]), np.asarray(want[path]), err_msg=path)
  # a legacy name the table does not know: no silent partial load
  del legacy[("confidence_b", "value")]
  legacy[("confidence_bias", "value")] = np.zeros((), np.float32)
  shutil.rmtree(old_run / "dspark" / "checkpoints")
  ckpt = Checkpoints(str(old_run / "dspark" / "checkpoints"))
  ckpt.save(1, unflatten_dict(legacy), {"step": np.int32(1)})
  ckpt.wait()
  ckpt.close()
  with pytest.raises(SpecjaxError, match="does not match the model config"):
    builtin.load_dspark(str(old_run), target, 5)
