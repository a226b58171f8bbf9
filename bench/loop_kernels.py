"""Kernels per decode step, counted in the compiled program: where a step's time goes on CPU.

XLA:CPU runs each top-level op of a `while_loop` body as its own kernel, at about 1-2
microseconds of dispatch each: on a target whose pass takes 0.5 ms, a few hundred kernels of
bookkeeping are a visible share of a step. Timing that share is noisy on a shared machine;
counting it is not. For each method and temperature (batch 1) this prints the kernels one
step of the decode loop launches, the kernels of the two parts the accounting model prices
(one target pass over K+1 positions, and one drafter step: propose + commit, as
`specjax.costs` times them), and the difference: the loop's own bookkeeping (verification,
commits, row writes, statistics). A nested loop counts its body times its trip count; a
`switch` counts its largest branch.

  python bench/loop_kernels.py --run_dir=runs/tiny [--methods=...] [--temperatures=0,1]
"""

from __future__ import annotations

import argparse
import re

import common  # sets sys.path
import jax
import jax.numpy as jnp

from specjax import costs, evaluate, methods, run_dir as run_dir_lib
from specjax.sampling import Sampler

METHODS = ",".join(methods.names())
# ops that launch nothing: tuple plumbing, constants, layout-free reshapes
FREE = {"parameter", "get-tuple-element", "tuple", "constant", "bitcast", "opt-barrier",
        "after-all"}


def computations(hlo_text: str) -> dict[str, list[str]]:
  """Instruction lines of each computation of a compiled module ('ENTRY' names the entry)."""
  comps, current = {}, None
  for line in hlo_text.splitlines():
    header = re.match(r"^(ENTRY )?%?([\w.\-]+) .*\{$", line)
    if header:
      current = comps.setdefault("ENTRY" if header.group(1) else header.group(2), [])
    elif line.startswith("}"):
      current = None
    elif current is not None and " = " in line:
      current.append(line.strip())
  return comps


def opcode(line: str) -> str:
  """The op of an instruction line `%name = TYPE op(...), attrs` (TYPE may be a tuple)."""
  rhs = line.split(" = ", 1)[1]
  if rhs.startswith("("):  # a tuple type: skip to its closing parenthesis
    depth = 0
    for i, ch in enumerate(rhs):
      depth += (ch == "(") - (ch == ")")
      if depth == 0:
        rhs = rhs[i + 1:]
        break
  else:
    rhs = rhs.split(" ", 1)[1]
  return rhs.strip().split("(", 1)[0]


def _attr(line: str, name: str) -> str:
  return re.search(name + r"=%?([\w.\-]+)", line).group(1)


def launches(comps, name: str) -> int:
  """Kernels one run of computation `name` launches."""
  total = 0
  for line in comps[name]:
    op = opcode(line)
    if op in FREE:
      continue
    if op == "conditional":
      branches = re.search(r"branch_computations=\{([^}]*)\}", line)
      names = ([b.strip().lstrip("%") for b in branches.group(1).split(",")] if branches else
               [_attr(line, "true_computation"), _attr(line, "false_computation")])
      total += 1 + max(launches(comps, b) for b in names)
    elif op == "while":
      trips = re.search(r'"known_trip_count":\{"n":"(\d+)"\}', line)
      per_trip = launches(comps, _attr(line, "body")) + launches(comps, _attr(line, "condition"))
      total += per_trip * (int(trips.group(1)) if trips else 1)
    elif op == "call":
      total += launches(comps, _attr(line, "to_apply"))
    else:
      total += 1
  return total


def loop_step_launches(hlo_text: str) -> int:
  """Kernels per iteration of the outermost while loop with the largest body (the decode
  loop, or a timing loop), its condition included."""
  comps = computations(hlo_text)
  loops = []

  def find(name):
    for line in comps[name]:
      op = opcode(line)
      if op == "while":
        loops.append((_attr(line, "body"), _attr(line, "condition")))
      elif op == "call":
        find(_attr(line, "to_apply"))

  find("ENTRY")
  if not loops:
    raise ValueError("the compiled program has no while loop")
  body, condition = max(loops, key=lambda bc: launches(comps, bc[0]))
  return launches(comps, body) + launches(comps, condition)


def compiled_text(fn, *args) -> str:
  return fn.lower(*args).compile().as_text()


def method_row(method, cfg, target, sampler, batch, cache_len):
  """(K, loop, target pass, drafter step) kernel counts for one method."""
  decoder, drafter, dparams = evaluate.make_decoder(method, cfg, target, sampler, cache_len, -1)
  tokens = jnp.full((batch, 32), 5, jnp.int32)
  lens = jnp.full((batch,), 32, jnp.int32)
  params = (target.params,) if drafter is None else (target.params, dparams)
  loop = loop_step_launches(compiled_text(type(decoder).decode, decoder, *params, tokens, lens,
                                          jax.random.key(0)))
  k = 0 if drafter is None else drafter.num_draft_tokens
  cache = target.module().init_cache(batch, cache_len)
  verify = loop_step_launches(compiled_text(
      costs.verify_loop(target.graphdef, batch=batch, n=k + 1), target.params, cache, 2))
  draft = 0
  if drafter is not None:
    init, many = costs.draft_loop(target.graphdef, drafter, batch=batch, cache_len=cache_len,
                                  sampler=sampler)
    state, verified = init(target.params, dparams, tokens)
    draft = loop_step_launches(compiled_text(many, target.params, dparams, state, verified, 2))
  return k, loop, verify, draft


def main(argv=None):
  parser = argparse.ArgumentParser()
  parser.add_argument("--run_dir", default="runs/tiny")
  parser.add_argument("--methods", default=METHODS)
  parser.add_argument("--temperatures", default="0,1")
  parser.add_argument("--batch", type=int, default=1)
  parser.add_argument("--cache_len", type=int, default=512)
  args = parser.parse_args(argv)
  target = run_dir_lib.load_target(args.run_dir)
  header = ("T", "method", "K", "loop step", "target pass", "drafter step", "bookkeeping",
            "share")
  rows = [header]
  for temperature in [float(t) for t in args.temperatures.split(",")]:
    cfg = common.decode_config(args.run_dir, temperature, 4, 32)
    sampler = Sampler(temperature, cfg.top_k, cfg.top_p)
    for method in [m for m in args.methods.split(",") if m]:
      k, loop, verify, draft = method_row(method, cfg, target, sampler, args.batch,
                                          args.cache_len)
      rest = loop - verify - draft
      rows.append((f"{temperature:g}", method, str(k), str(loop), str(verify), str(draft),
                   str(rest), f"{rest / loop:.0%}"))
      print(f"[loop_kernels] T={temperature:g} {method} done", flush=True)
  print(f"kernels per decode step, batch {args.batch}, {args.run_dir}")
  widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
  for r in rows:
    print("  ".join(c.rjust(w) if i >= 2 else c.ljust(w) for i, (c, w) in
                    enumerate(zip(r, widths))))


if __name__ == "__main__":
  main()
