"""configs/smollm2.py: every drafter on the same data and budget, each one sized by the plan
against SmolLM2's shape (no checkpoint needed)."""

import pytest

from specjax import config_base, plan
from specjax.drafters import dflash, eagle3

SMOLLM2 = dict(num_layers=30, d_model=576, num_heads=9, num_kv_heads=3, head_dim=64,
               mlp_dim=1536, rope_theta=100000.0, qk_norm=False, tie_embeddings=True,
               norm_eps=1e-5)


def smollm2_module():
  import importlib.util
  import os
  from conftest import ROOT
  path = os.path.join(ROOT, "configs", "smollm2.py")
  spec = importlib.util.spec_from_file_location("smollm2_config", path)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def test_every_smollm2_drafter_shares_data_and_budget_and_plans():
  mod = smollm2_module()
  assert set(mod.METHODS) == {"draft", "mtp_parallel", "mtp_sequential", "dflash", "dspark",
                              "dflash2", "eagle3"}
  regens = set()
  for method in mod.METHODS:
    cfg = mod.get_config(method)
    regens.add(str(cfg.regen))
    assert cfg.time_budget_s == mod.BUDGET_S and cfg.seq_len == 384 and cfg.feature_cache_store
    assert cfg.get("label_source", "target") == "target"
    if method in mod.DRAFT_LAYERS:  # Z Lab's rule: one target layer per drafter layer, 1..L-3
      assert dflash.feature_layers(cfg, 30) == (1, 14, 27) and cfg.block_size == 8
    else:
      assert cfg.train_on == "regenerated"
    cfg.target_model = config_base.model_defaults()
    cfg.target_model.update(SMOLLM2)
    cfg.target_vocab_size = 49152
    cfg.plan_devices = 1
    out = plan.run(cfg, "train")
    rows = dict((r[0], r[1]) for r in out["rows"])
    assert rows["frozen target"] == pytest.approx(134.5e6 * 4, rel=0.02)  # float32
  assert len(regens) == 1  # the same rows for all
  assert eagle3.feature_layers(mod.get_config("eagle3"), 30) == (2, 15, 27)
  with pytest.raises(ValueError, match="pick one of"):
    mod.get_config("medusa")
