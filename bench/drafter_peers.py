"""bench/peers.py's drafter rows: specjax's trained drafters beside their reference decoders,
on the same prompt ids (batch 1, greedy, the same max_new_tokens).

  specjax       dflash, dflash2 (block 8: 7 drafts a step), draft (K drafts) through the
                evaluate.Harness that decodes peers.py's AR row, with tau and, per prompt, the
                tokens committed at each step (record_steps: from that very decode)
  Z Lab dflash  each block drafter exported in Z Lab's format (specjax.interop.zlab), loaded by
                the `dflash` package and run with its `dflash_generate` on transformers' target;
                tau = mean of its acceptance_lengths (tokens committed per step, the first
                token from the prefill excluded: specjax's convention, except that both clip a
                step cut short by max_new_tokens or EOS, which specjax's tau does not), and how
                many prompts commit the same number of tokens at every step as specjax
  transformers  generate(assistant_model=the draft model exported to Hugging Face format),
                K assistant tokens a step (constant schedule, no confidence early stop); tau =
                generated tokens / target passes (its first pass reads the prompt and the first
                drafts together)
A peer that cannot run (not installed, export error) prints one line; its rows are left out.
"""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
import time

from specjax import run_dir as run_dir_lib

DRAFTERS = ("dflash", "dflash2", "draft")
BLOCK_DRAFTERS = ("dflash", "dflash2")
BLOCK_SIZE = 8  # the SmolLM2 block drafters' training block: 7 drafts a step


def present(run_dir: str, name: str) -> bool:
  ckpts = os.path.join(run_dir_lib.model_dir(run_dir, name), "checkpoints")
  return os.path.isdir(ckpts) and any(s.isdigit() for s in os.listdir(ckpts))


def select(run_dir: str, spec: str | None) -> list[str]:
  """The drafters to run: `spec` (comma-separated) or, when None, those the run dir holds. A
  requested one that is unknown or untrained prints one line and is left out."""
  if spec is None:
    return [d for d in DRAFTERS if present(run_dir, d)]
  out = []
  for name in [d for d in spec.split(",") if d]:
    if name not in DRAFTERS:
      print(f"drafter '{name}': unknown (known: {', '.join(DRAFTERS)}); its rows are left out")
    elif not present(run_dir, name):
      print(f"drafter '{name}': no trained checkpoint in "
            f"{run_dir_lib.model_dir(run_dir, name)}; its rows are left out")
    else:
      out.append(name)
  return out


def configure(cfg, drafters):
  """decode.py's config for the drafter rows: block 8, per-step commits recorded."""
  cfg.block_size, cfg.record_steps = BLOCK_SIZE, bool(drafters)


def specjax_rows(harness, cfg, drafters, decoder_name):
  """specjax's row per drafter ({decoder, method, tokens_per_second, tau, outputs,
  committed_per_step}); a drafter that fails to load or decode prints one line."""
  rows = []
  for method in drafters:
    try:
      e = harness.run(method, cfg)
    except Exception as err:  # noqa: BLE001 (a failing row never ends the run)
      print(f"specjax {method}: {one_line(err)}; its row is left out")
      continue
    rows.append({"decoder": decoder_name, "method": method,
                 "tokens_per_second": e["tokens_per_second"], "tau": e["tau"],
                 "outputs": [o["token_ids"] for o in e["outputs"]],
                 "committed_per_step": e.get("committed_per_step")})
  return rows


def one_line(err: BaseException) -> str:
  text = str(err).strip().splitlines()
  return f"{type(err).__name__}: {text[0][:200] if text else ''}"


def strip_eos(out: list[int], eos_ids) -> list[int]:
  return out[:-1] if out and out[-1] in eos_ids else out


def load_zlab(run_dir: str, method: str, tmp: str):
  """Z Lab's drafter module for run_dir/<method>, via their loader. specjax's SmolLM2 drafters
  have no q/k norms (Llama layers): their stock layer's q_norm / k_norm become identity."""
  import torch
  from dflash import model as zlab_model

  from specjax.interop import zlab
  with contextlib.redirect_stdout(io.StringIO()):
    zlab.export_dflash(run_dir, tmp, method)
  cls = zlab_model.DFlash2DraftModel if method == "dflash2" else zlab_model.DFlashDraftModel
  from transformers.utils import logging
  level = logging.get_verbosity()
  logging.set_verbosity_error()  # not the "newly initialized" q/k norm weights report
  bar = logging.is_progress_bar_enabled()
  logging.disable_progress_bar()
  try:
    with contextlib.redirect_stdout(io.StringIO()):
      drafter = cls.from_pretrained(tmp, dtype=torch.float32).eval()
  finally:
    logging.set_verbosity(level)
    if bar:
      logging.enable_progress_bar()
  if drafter.config.dflash_config.get("qk_norm", True) is False:
    for layer in drafter.layers:
      layer.self_attn.q_norm = torch.nn.Identity()
      layer.self_attn.k_norm = torch.nn.Identity()
  return drafter


def zlab_rows(run_dir, target, ids, args, eos_ids, ours: dict):
  """Z Lab's row per block drafter in `ours` ({method: specjax row})."""
  rows = []
  for method, mine in ours.items():
    if method not in BLOCK_DRAFTERS:
      continue
    try:
      import torch
      from dflash import model as zlab_model
      zlab_model._cuda_time = time.perf_counter  # their timer synchronizes CUDA; none here
      with tempfile.TemporaryDirectory() as tmp:
        drafter = load_zlab(run_dir, method, tmp)

      def generate(prompt, max_new):
        return zlab_model.dflash_generate(drafter, target, torch.tensor([prompt]), max_new,
                                          eos_ids, temperature=0.0, block_size=BLOCK_SIZE,
                                          return_stats=True)
      generate(ids[0], 4)  # warm-up
      outputs, steps, wall, generated = [], [], 0.0, 0
      for prompt in ids:
        t = time.perf_counter()
        stats = generate(prompt, args.max_new_tokens)
        wall += time.perf_counter() - t
        out = stats.output_ids[0, len(prompt):].tolist()
        generated += len(out)
        outputs.append(strip_eos(out, eos_ids))
        steps.append([int(n) for n in stats.acceptance_lengths])
    except Exception as err:  # noqa: BLE001
      print(f"Z Lab {method}: {one_line(err)}; its row is left out")
      continue
    flat = [n for s in steps for n in s]
    equal = sum(a == b for a, b in zip(steps, mine.get("committed_per_step") or []))
    print(f"Z Lab {method}: acceptance equal on {equal}/{len(ids)} prompts", flush=True)
    rows.append({"decoder": "Z Lab dflash", "method": method,
                 "tokens_per_second": generated / wall, "tau": sum(flat) / max(1, len(flat)),
                 "outputs": outputs, "committed_per_step": steps,
                 "acceptance_equal": f"{equal}/{len(ids)}"})
  return rows


def assisted_rows(run_dir, target, ids, args, eos_ids):
  """transformers' assisted generation with the run's draft model, K drafts a step."""
  try:
    import torch
    from transformers import AutoModelForCausalLM

    from specjax.interop import hf
    with tempfile.TemporaryDirectory() as tmp:
      with contextlib.redirect_stdout(io.StringIO()):
        hf.export_hf(run_dir, tmp, "draft")
      assistant = AutoModelForCausalLM.from_pretrained(
          tmp, dtype=torch.float32, attn_implementation="sdpa").eval()
    gen = assistant.generation_config
    gen.num_assistant_tokens, gen.num_assistant_tokens_schedule = args.k, "constant"
    if hasattr(gen, "assistant_confidence_threshold"):
      gen.assistant_confidence_threshold = 0.0  # 0 turns the early stop off
    calls = [0]
    hook = target.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    kw = dict(max_new_tokens=args.max_new_tokens, do_sample=False, eos_token_id=eos_ids,
              pad_token_id=eos_ids[0], assistant_model=assistant)
    try:
      with torch.inference_mode():
        target.generate(torch.tensor([ids[0]]), **{**kw, "max_new_tokens": 4})  # warm-up
        calls[0] = 0
        outputs, wall, generated = [], 0.0, 0
        for prompt in ids:
          t = time.perf_counter()
          out = target.generate(torch.tensor([prompt]), **kw)[0, len(prompt):].tolist()
          wall += time.perf_counter() - t
          generated += len(out)
          outputs.append(strip_eos(out, eos_ids))
    finally:
      hook.remove()
  except Exception as err:  # noqa: BLE001
    print(f"transformers assisted (draft): {one_line(err)}; its row is left out")
    return []
  return [{"decoder": "transformers", "method": "draft",
           "tokens_per_second": generated / wall, "tau": generated / max(1, calls[0]),
           "outputs": outputs}]


def peer_rows(run_dir, target, ids, args, eos_ids, rows):
  """Every peer row for the drafters among specjax's `rows`; `target` is transformers' model
  (None: no transformers peers)."""
  ours = {r["method"]: r for r in rows
          if r["decoder"].startswith("specjax") and r["method"] in DRAFTERS}
  if target is None or not ours:
    return []
  out = zlab_rows(run_dir, target, ids, args, eos_ids, ours)
  if "draft" in ours:
    out += assisted_rows(run_dir, target, ids, args, eos_ids)
  return out
