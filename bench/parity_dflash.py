"""DFlash parity with Z Lab's reference (`dflash` package) and the T=1 proposal modes.

  python bench/parity_dflash.py --run_dir=runs/tiny [--prompts=4] [--max_new=48]

Prints, for the run's target:
1. drafter logits: a random z-lab `DFlashDraftModel` (norms perturbed) for this target,
   imported, against the reference's on the same features and block: max |diff|, argmax
   agreement;
2. greedy decoding: the run's DFlash drafter (if it was trained with a mask token, so it
   exports; else the random one) and the target, exported, decoded by `dflash_generate`
   (temperature 0) and by specjax: token agreement, identical per-step lengths, mean length;
3. T=1 tau of DFlash (and parallel MTP, where trained) with argmax and sampled proposals,
   through decode.py's harness on the bundled prompts.
Works on copies in a temporary folder; the run directory is only read.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from specjax import run_dir as run_dir_lib  # noqa: E402
from specjax.interop import zlab  # noqa: E402


def random_zlab_drafter(target_cfg, folder: str, block_size: int = 8, seed: int = 0):
  """A random z-lab drafter for this target (its own head shape), norms perturbed, saved."""
  import torch
  from dflash.model import DFlashDraftModel
  from transformers import Qwen3Config
  torch.manual_seed(seed)
  n = target_cfg.num_layers
  ids = zlab.default_target_layer_ids(n, 2) if n >= 6 else list(range(max(1, n - 1)))[:2]
  config = Qwen3Config(vocab_size=target_cfg.vocab_size, hidden_size=target_cfg.d_model,
                       intermediate_size=2 * target_cfg.d_model, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2,
                       head_dim=target_cfg.d_model // 4, rms_norm_eps=1e-6,
                       num_target_layers=n, block_size=block_size,
                       dflash_config={"target_layer_ids": ids,
                                      "mask_token_id": target_cfg.vocab_size - 1})
  model = DFlashDraftModel(config).float().eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "norm" in name:
        p.copy_(1.0 + 0.3 * torch.randn(p.shape))
  model.save_pretrained(folder)
  return model


def logit_parity(run_dir: str, work: str):
  """(max |logit diff|, argmax agreement) of an imported random drafter vs the reference."""
  import torch
  from dflash.model import extract_context_feature
  from specjax.methods.builtin import load_dflash
  run = os.path.join(work, "random_run")
  shutil.copytree(os.path.join(run_dir, "target"), os.path.join(run, "target"))
  target = run_dir_lib.load_target(run)
  ref = random_zlab_drafter(target.model_cfg, os.path.join(work, "random_zlab"))
  zlab.import_dflash(os.path.join(work, "random_zlab"), run)
  graphdef, params, layers = load_dflash(run, target, ref.block_size)
  model, module = nnx.merge(graphdef, params), target.module()
  b, t, bs = 2, 24, ref.block_size
  tokens = jax.random.randint(jax.random.key(0), (b, t), 1, target.model_cfg.vocab_size - 1)
  pending = tokens[:, -1:]
  out = module(tokens, feature_layers=tuple(range(target.model_cfg.num_layers + 1)))
  positions = jnp.broadcast_to(jnp.arange(t), (b, t))
  ctx = model.context_kv(model.project(tuple(out.features[l] for l in layers)), positions)
  hidden = model(model.block_inputs(module, pending, bs), positions[:, :bs] + t, ctx,
                 jnp.ones((b, bs, t + bs), bool))
  ours = np.asarray(model.draft_logits(module, hidden[:, 1:]))
  embed = torch.tensor(np.asarray(module.embedding[...]))
  head = embed if target.model_cfg.tie_embeddings else torch.tensor(
      np.asarray(module.lm_head[...]).T)
  ids = torch.cat([torch.tensor(np.asarray(pending)),
                   torch.full((b, bs - 1), ref.mask_token_id)], 1)
  with torch.no_grad():
    h = ref(target_hidden=extract_context_feature(
                [torch.tensor(np.asarray(f)) for f in out.features], ref.target_layer_ids),
            noise_embedding=torch.nn.functional.embedding(ids, embed),
            position_ids=torch.arange(t + bs)[None].expand(b, -1))
    theirs = ref.compute_logits(h[:, 1:], lambda x: x @ head.T).numpy()
  return float(np.abs(ours - theirs).max()), float((ours.argmax(-1) == theirs.argmax(-1)).mean())


def generate_parity(run_dir: str, work: str, num_prompts: int, max_new: int):
  """Greedy dflash_generate vs specjax on exported copies: (equal tokens, tokens, mean
  committed per step, theirs and ours, which drafter). tests/test_interop_zlab.py checks per-step
  lengths one by one."""
  import dflash.model as dm
  import torch
  from transformers import AutoModelForCausalLM

  from specjax.data import prompts as prompts_lib
  from specjax.decoding.common import pad_prompts
  from specjax.sampling import Sampler
  from specjax.decoding.speculative import SpeculativeDecoder
  from specjax.drafters.dflash import DFlashDrafter
  from specjax.interop import hf
  from specjax.methods.builtin import load_dflash
  trained = os.path.join(run_dir, "dflash", "config.json")
  use_trained = (os.path.exists(trained)
                 and int(run_dir_lib.load_config(os.path.dirname(trained))
                         .get("mask_token_id", -1)) >= 0)
  run = run_dir if use_trained else os.path.join(work, "random_run")
  which = "trained" if use_trained else "random (the run's drafter has a learned mask vector)"
  zdir, hdir = os.path.join(work, "export_zlab"), os.path.join(work, "export_hf")
  zlab.export_dflash(run, zdir)
  hf.export_hf(run, hdir)
  dm._cuda_time = time.perf_counter  # return_stats synchronises CUDA; none on CPU
  ref_target = AutoModelForCausalLM.from_pretrained(hdir, dtype=torch.float32).eval()
  ref = dm.DFlashDraftModel.from_pretrained(zdir, dtype=torch.float32).eval()
  target = run_dir_lib.load_target(run)
  graphdef, params, layers = load_dflash(run, target, ref.block_size)
  drafter = DFlashDrafter(ref.block_size - 1, graphdef=graphdef, target_feature_layers=layers)
  tok = run_dir_lib.load_tokenizer(run)
  texts = prompts_lib.load_prompts("", num_prompts)
  decoder = SpeculativeDecoder(target.graphdef, Sampler(), max_new, 512, -1, False, drafter)
  same = total = 0
  theirs_len, ours_len = [], []
  for text in texts:
    prompt = tok.encode(text).ids[-200:]
    stats = dm.dflash_generate(ref, ref_target, torch.tensor([prompt]), max_new, None,
                               temperature=0.0, return_stats=True)
    ref_ids = stats.output_ids[0, len(prompt):].tolist()
    tokens, lens = pad_prompts([prompt], 1)
    res = decoder(target.params, params, tokens, lens, jax.random.key(0))
    ours = np.asarray(res.tokens_BxN)[0, :int(res.num_tokens_B[0])].tolist()
    same += sum(a == b for a, b in zip(ours, ref_ids))
    total += max(len(ours), len(ref_ids))
    theirs_len.append((len(ref_ids) - 1) / len(stats.acceptance_lengths))
    ours_len.append((len(ours) - 1) / max(int(res.verify_steps_B[0]), 1))
  return same, total, float(np.mean(theirs_len)), float(np.mean(ours_len)), which


def proposal_taus(run_dir: str, work: str, methods: str):
  """{method: {proposal: (tau, a_k)}} at T=1 on the bundled prompts."""
  from specjax import evaluate
  from specjax import methods as method_options
  import importlib.util
  spec = importlib.util.spec_from_file_location(
      "decode_cfg", os.path.join(os.path.dirname(os.path.dirname(__file__)), "configs",
                                 "decode.py"))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  out = {}
  for proposal in ("argmax", "sample"):
    cfg = mod.get_config()
    cfg.update(dict(run_dir=run_dir, methods=methods, temperature=1.0,
                    output_json=os.path.join(work, f"t1_{proposal}.json"), plot=False,
                    measure_costs=False, timing_repeats=1))
    for name in methods.split(","):
      cfg = method_options.with_options(cfg, name, proposal=proposal)
    report = evaluate.evaluate(cfg)["methods"]
    for name in methods.split(","):
      if name in report:
        out.setdefault(name, {})[proposal] = (report[name]["tau"],
                                              report[name]["acceptance_per_position"])
  return out


def print_taus(run_dir: str, work: str):
  methods = ",".join(m for m in ("dflash", "mtp_parallel")
                     if os.path.isdir(os.path.join(run_dir, m, "checkpoints")))
  if not methods:
    print(f"(no trained dflash / mtp_parallel in {run_dir}: no T=1 proposal comparison)")
    return
  for name, modes in proposal_taus(run_dir, work, methods).items():
    for proposal, (tau, a_k) in modes.items():
      print(f"{name:<13} T=1 proposal={proposal:<7} tau {tau:.3f}  a_k "
            + " ".join(f"{a:.2f}" for a in a_k))


def main(argv=None):
  parser = argparse.ArgumentParser()
  parser.add_argument("--run_dir", default="runs/tiny")
  parser.add_argument("--prompts", type=int, default=4)
  parser.add_argument("--max_new", type=int, default=48)
  parser.add_argument("--skip_tau", action="store_true")
  args = parser.parse_args(argv)
  run_dir = run_dir_lib.resolve(args.run_dir)
  with tempfile.TemporaryDirectory() as work:
    diff, agree = logit_parity(run_dir, work)
    print(f"dflash  drafter logits vs reference: max |diff| {diff:.2e}, argmax agreement "
          f"{agree:.3f}")
    same, total, theirs, ours, which = generate_parity(run_dir, work, args.prompts,
                                                       args.max_new)
    print(f"dflash  greedy vs dflash_generate ({which} drafter): tokens equal {same}/{total}, "
          f"committed per step {theirs:.2f} (reference) vs {ours:.2f} (specjax)")
    if not args.skip_tau:
      print_taus(run_dir, work)


if __name__ == "__main__":
  main()
