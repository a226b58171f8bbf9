"""What the AR and speculative loops share: prompts, prefill, committing tokens, results."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct

from specjax.errors import SpecjaxError
from specjax.models import write_rows


@struct.dataclass
class DecodeResult:
  tokens_BxN: jax.Array  # generated ids; row b is valid up to num_tokens_B[b] (EOS included)
  num_tokens_B: jax.Array
  target_calls: jax.Array  # target forward passes, the prefill included
  verify_steps_B: jax.Array  # target passes after the prefill in which the row was active
  accept_counts: jax.Array  # [K+1]: how many (row, step) pairs accepted m = 0..K drafts
  cache: object = None  # the final target KV cache, when the decoder has keep_cache=True
  # [2, K]: (row, step) pairs that verified draft k, and that accepted it (budgets make this
  # differ from what accept_counts implies); set by the speculative loop
  position_counts: jax.Array | None = None
  budget_counts: jax.Array | None = None  # [K+1] histogram of per-row budgets (budgeted drafters)
  width_counts: jax.Array | None = None  # [K+1] histogram of the verify width per step
  draft_stats: dict | None = None  # sums of the drafter's step_statistics
  # [B, N]: tokens each row committed at each verify step, -1 after its last (set by the
  # speculative loop when it runs with record_steps=True; bench/drafter_peers.py reads it)
  committed_BxN: jax.Array | None = None


def pad_prompts(prompts: list[list[int]], pad_id: int, multiple: int = 16):
  """Right-padded [B, P] int32 tokens and [B] lengths; P rounded up to limit recompiles."""
  if not prompts:
    raise SpecjaxError("no prompts to decode")
  empty = [i for i, p in enumerate(prompts) if len(p) == 0]
  if empty:
    raise SpecjaxError(f"prompt {empty[0]} tokenizes to nothing; remove empty prompts")
  longest = max(len(p) for p in prompts)
  width = -(-longest // multiple) * multiple
  tokens = np.full((len(prompts), width), pad_id, np.int32)
  for i, p in enumerate(prompts):
    tokens[i, :len(p)] = p
  return tokens, np.asarray([len(p) for p in prompts], np.int32)


def check_fits(prompt_lens, max_new_tokens: int, lookahead: int, cache_len: int,
               padded_width: int = 0):
  """Every row must fit prompt + max_new_tokens + the verify window in the cache (and the
  prefill writes the prompts at their padded width)."""
  if padded_width > cache_len:
    raise SpecjaxError(f"prompts padded to {padded_width} tokens do not fit cache_len="
                       f"{cache_len}; raise --config.cache_len or shorten the prompts")
  need = int(np.max(prompt_lens)) + max_new_tokens + lookahead + 1
  if need > cache_len:
    i = int(np.argmax(prompt_lens))
    raise SpecjaxError(
        f"prompt {i} has {int(prompt_lens[i])} tokens; with max_new_tokens={max_new_tokens} and "
        f"{lookahead} draft tokens it needs a cache of {need} > cache_len={cache_len}; raise "
        "--config.cache_len or shorten the prompt")


def prefill(target, tokens_BxP, lens_B, cache_len: int, feature_layers=()):
  """Runs the prompts through the target. Returns (cache with end = lengths, the pass's
  output (hidden states and features; no logits), logits at each row's last prompt token).
  The LM head runs on the last positions only: over a whole 200-token prompt it is 12 GFLOP
  of a small model's 66."""
  cache = target.init_cache(tokens_BxP.shape[0], cache_len)
  out = target(tokens_BxP, cache=cache, feature_layers=feature_layers, compute_logits=False)
  hidden_Bx1xD = jnp.take_along_axis(out.hidden_BxTxD, (lens_B - 1)[:, None, None], axis=1)
  return out.cache.rollback(lens_B), out, target.logits(hidden_Bx1xD)[:, 0]


def eos_set(eos_id) -> tuple[int, ...]:
  """EOS as a tuple of ids (a checkpoint may name several); an int is one id."""
  return tuple(int(e) for e in eos_id) if isinstance(eos_id, (tuple, list)) else (int(eos_id),)


def commit_tokens(out_BxN, count_B, done_B, new_BxT, num_new_B, max_new_B, eos_id):
  """Appends the first num_new_B[b] tokens of new_BxT to each active row, stopping at EOS
  (any of the ids in `eos_id`; kept) or max_new_B. Returns (out, count, done)."""
  active = ~done_B
  t = new_BxT.shape[1]
  valid = jnp.arange(t)[None, :] < num_new_B[:, None]
  is_eos = jnp.isin(new_BxT, jnp.asarray(eos_set(eos_id), jnp.int32)) & valid
  has_eos = is_eos.any(-1)
  n = jnp.where(has_eos, jnp.argmax(is_eos, -1) + 1, num_new_B)
  n = jnp.where(active, jnp.minimum(n, max_new_B - count_B), 0)
  out_BxN = write_rows(out_BxN, new_BxT, count_B, where_B=active)
  count_B = count_B + n
  done_B = done_B | (active & has_eos) | (count_B >= max_new_B)
  return out_BxN, count_B, done_B


@struct.dataclass
class LoopState:
  """The carry of a decode loop (the speculative loop adds the drafter's state)."""
  cache: object  # the target's KVCache
  pending_B: jax.Array  # last committed token, not yet in the cache
  out_BxN: jax.Array  # committed tokens per row
  count_B: jax.Array
  done_B: jax.Array
  rng: jax.Array
  target_calls: jax.Array
  steps_B: jax.Array  # verify steps in which the row was active


@dataclasses.dataclass(frozen=True)
class DecodeLoop:
  """Static description of a decode loop (hashable: the jitted __call__ takes it as static)."""

  graphdef: nnx.GraphDef
  sampler: object  # decoding.sampling.Sampler
  max_new_tokens: int
  cache_len: int
  eos_id: int | tuple[int, ...]  # decoding stops on any of them
  keep_cache: bool = False  # return the final target cache (tests inspect it)
  # sharding.Layout: run the loop over a mesh (None: one device); keyword-only, so the
  # positional fields of the loops that extend this one keep their places
  layout: object = dataclasses.field(default=None, kw_only=True)

  def shard(self, state):
    """The loop state under the layout's shardings (unchanged on one device)."""
    if self.layout is None:
      return state
    return self.layout.constrain(state, state.pending_B.shape[0])

  @property
  def lookahead(self) -> int:
    """Positions a step writes past the committed length (the drafts)."""
    return 0

  def __call__(self, *args) -> DecodeResult:
    """args: the parameters the loop takes, then tokens_BxP, lens_B, rng. Checks on the host
    that every row fits the cache (a row past it would silently overwrite its own
    history), then runs the jitted loop `decode`."""
    tokens_BxP, lens_B = args[-3], args[-2]
    if not isinstance(lens_B, jax.core.Tracer):
      lens = lens_B
      if isinstance(lens, jax.Array) and not lens.is_fully_addressable:  # several processes
        lens = np.concatenate([np.asarray(s.data) for s in lens.addressable_shards])
      check_fits(np.asarray(lens), self.max_new_tokens, self.lookahead, self.cache_len,
                 tokens_BxP.shape[1])
    return self.decode(*args)

  def start(self, target, tokens_BxP, lens_B, rng, feature_layers=(), lookahead: int = 0):
    """Prefill, then the first token (sampled from the prompt's last logits) committed.
    Returns (cache, prefill output, rng, first_B, out_BxN, count_B, done_B)."""
    b = tokens_BxP.shape[0]
    cache, pre_out, last_logits = prefill(target, tokens_BxP, lens_B, self.cache_len,
                                          feature_layers)
    rng, first_rng = jax.random.split(rng)
    first_B = self.sampler.sample(last_logits, first_rng)
    zeros = jnp.zeros((b,), jnp.int32)
    out = jnp.zeros((b, self.max_new_tokens + lookahead + 1), jnp.int32)
    out, count, done = commit_tokens(out, zeros, zeros.astype(bool), first_B[:, None],
                                     zeros + 1, self.max_new_B(zeros), self.eos_id)
    return cache, pre_out, rng, first_B, out, count, done

  def max_new_B(self, count_B):
    """Every row's token limit (the same for all: a row's count says where it stands)."""
    return jnp.full_like(count_B, self.max_new_tokens)

  def result(self, final, accept_counts) -> DecodeResult:
    """The loop's final state (fields out_BxN, count_B, target_calls, steps_B, cache)."""
    return DecodeResult(
        tokens_BxN=final.out_BxN[:, :self.max_new_tokens], num_tokens_B=final.count_B,
        target_calls=final.target_calls, verify_steps_B=final.steps_B,
        accept_counts=accept_counts, cache=final.cache if self.keep_cache else None)


def to_lists(result: DecodeResult, eos_id) -> list[list[int]]:
  """Host side: each row's generated ids, without the EOS that ended it."""
  tokens = np.asarray(result.tokens_BxN)
  counts = np.asarray(result.num_tokens_B)
  return [row_ids(row, n, eos_id) for row, n in zip(tokens, counts)]


def row_ids(row, count, eos_id) -> list[int]:
  """One row's first `count` generated ids, without the EOS that ended it."""
  ids = [int(t) for t in row[:count]]
  if ids and ids[-1] in eos_set(eos_id):
    ids = ids[:-1]
  return ids
