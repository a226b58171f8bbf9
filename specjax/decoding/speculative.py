"""The draft-verify loop: one jitted `lax.while_loop`, no host round trip per step.

Each step: the drafter proposes K tokens; the target scores [pending, d_1..d_K] in one pass
(appending to its KV cache); verification accepts m drafts per row and adds one target token;
the target cache is rolled back to the committed length by end index; the drafter keeps
what the accepted tokens justify. Per-step statistics stay on device.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx, struct

from specjax.decoding.common import DecodeLoop, DecodeResult, LoopState, commit_tokens
from specjax.decoding.schedule import verify_at_width
from specjax.decoding.verify import verify_greedy, verify_sampling
from specjax.drafters.base import Context, Drafter, Prefill, Verified
from specjax.models import write_rows


@struct.dataclass
class SpecState(LoopState):
  draft_state: object = None
  seq_BxS: jax.Array = None  # committed tokens by position: prompt, then generated
  accept_counts: jax.Array = None  # [K+1]
  position_counts: jax.Array = None  # [2, K]: drafts verified / accepted per position
  budget_counts: jax.Array = None  # [K+1]: per-row budgets (budgeted drafters)
  width_counts: jax.Array = None  # [K+1]: verify width per step
  draft_stats: dict = None
  committed_BxN: jax.Array = None  # [B, max_new_tokens] per-step commits (record_steps)


@dataclasses.dataclass(frozen=True)
class SpeculativeDecoder(DecodeLoop):
  drafter: Drafter = None
  # the T > 0 rule (p, drafts, q | None, rng) -> (m, next): a research hook; the default is
  # the lossless rule of SPEC section 2
  sampling_verifier: Callable = verify_sampling
  # keep each row's committed count per step (DecodeResult.committed_BxN): off by default
  record_steps: bool = False

  @property
  def lookahead(self) -> int:
    return self.drafter.num_draft_tokens

  @functools.partial(jax.jit, static_argnums=0)
  def decode(self, target_params, drafter_params, tokens_BxP, lens_B, rng) -> DecodeResult:
    state = self.init_state(target_params, drafter_params, tokens_BxP, lens_B, rng)
    final = jax.lax.while_loop(lambda s: ~jnp.all(s.done_B),
                               lambda s: self.step(target_params, drafter_params, s), state)
    return self.finish(final)

  def init_state(self, target_params, drafter_params, tokens_BxP, lens_B, rng) -> SpecState:
    """The prefill, the first token and the drafter's state: the carry before step one."""
    target = nnx.merge(self.graphdef, target_params)
    drafter, k = self.drafter, self.drafter.num_draft_tokens
    b, p = tokens_BxP.shape
    cache, pre_out, rng, first_B, out, count, done = self.start(
        target, tokens_BxP, lens_B, rng, drafter.feature_layers, lookahead=k)
    draft_state = drafter.init(drafter_params, target,
                               Prefill(tokens_BxP, lens_B, pre_out, self.cache_len))
    seq = jnp.zeros((b, self.cache_len), jnp.int32).at[:, :p].set(tokens_BxP)
    seq = write_rows(seq, first_B[:, None], lens_B)
    state = SpecState(cache=cache, pending_B=first_B, out_BxN=out, count_B=count, done_B=done,
                      rng=rng, target_calls=jnp.int32(1), steps_B=jnp.zeros_like(count),
                      draft_state=draft_state, seq_BxS=seq,
                      accept_counts=jnp.zeros((k + 1,), jnp.int32),
                      position_counts=jnp.zeros((2, k), jnp.int32),
                      budget_counts=jnp.zeros((k + 1,), jnp.int32),
                      width_counts=jnp.zeros((k + 1,), jnp.int32),
                      draft_stats=drafter.step_statistics(draft_state, jnp.zeros((b,), bool)),
                      committed_BxN=(jnp.full((b, self.max_new_tokens), -1, jnp.int32)
                                     if self.record_steps else None))
    return self.shard(state)

  def step(self, target_params, drafter_params, s: SpecState) -> SpecState:
    """One draft-verify step over every row (rows already done commit nothing)."""
    target = nnx.merge(self.graphdef, target_params)
    drafter, k = self.drafter, self.drafter.num_draft_tokens
    b = s.pending_B.shape[0]
    budgeted = drafter.verify_widths is not None
    rng, draft_rng, verify_rng = jax.random.split(s.rng, 3)
    end_B = s.cache.end_B
    drafts_BxK, q, draft_state = drafter.propose(
        drafter_params, target, s.draft_state, Context(s.seq_BxS, end_B, s.pending_B),
        self.sampler, draft_rng)
    window = jnp.concatenate([s.pending_B[:, None], drafts_BxK], axis=1)
    active = ~s.done_B
    budget_B = drafter.verify_budget(drafter_params, draft_state, active) if budgeted else None
    if budget_B is None:
      verify_out = target(window, cache=s.cache, feature_layers=drafter.feature_layers)
      width = jnp.int32(k)
    else:  # fixed before verification; the pass runs at a width that holds every budget
      budget_B = jnp.where(active, jnp.clip(budget_B, 0, k), 0)
      verify_out, width = verify_at_width(target, window, s.cache, drafter.verify_widths,
                                          jnp.max(budget_B), drafter.feature_layers)
    budget_kw = {} if budget_B is None else {"budget_B": budget_B}
    if self.sampler.greedy:
      m_B, next_B = verify_greedy(verify_out.logits_BxTxV, drafts_BxK, budget_B)
    else:
      m_B, next_B = self.sampling_verifier(self.sampler.probs(verify_out.logits_BxTxV),
                                           drafts_BxK, q, verify_rng, **budget_kw)
    # committed this step: d_1..d_m then the target's token
    slot = jnp.arange(k + 1)[None, :]
    new_BxK1 = jnp.where(slot < m_B[:, None], jnp.pad(drafts_BxK, ((0, 0), (0, 1))),
                         next_B[:, None])
    out, count, done = commit_tokens(s.out_BxN, s.count_B, s.done_B, new_BxK1, m_B + 1,
                                     self.max_new_B(s.count_B), self.eos_id)
    # EOS or max_new_tokens may cut a row's last step short: its cache then keeps only what
    # it committed (n <= m + 1 tokens), so a finished row never writes past the cache
    n_B = count - s.count_B
    seq = write_rows(s.seq_BxS, new_BxK1, end_B + 1, where_B=active)
    draft_state = drafter.commit(
        drafter_params, target, draft_state,
        Verified(window, end_B, jnp.maximum(n_B - 1, 0), next_B, verify_out, active))
    hist = (jax.nn.one_hot(m_B, k + 1, dtype=jnp.int32) * active[:, None]).sum(0)
    # draft j was verified when drafts < j were accepted and the budget reached j
    pos = jnp.arange(1, k + 1)[None, :]
    limit_B = jnp.full_like(m_B, k) if budget_B is None else budget_B
    reached = active[:, None] & (m_B[:, None] >= pos - 1) & (limit_B[:, None] >= pos)
    accepted = active[:, None] & (m_B[:, None] >= pos)
    position_counts = s.position_counts + jnp.stack([reached.sum(0), accepted.sum(0)])
    budget_hist = (jax.nn.one_hot(limit_B, k + 1, dtype=jnp.int32) * active[:, None]).sum(0)
    stats = jax.tree.map(jnp.add, s.draft_stats, drafter.step_statistics(draft_state, active))
    committed = s.committed_BxN
    if committed is not None:  # every step commits >= 1 token: steps_B < max_new_tokens
      rows = jnp.arange(b)
      step_B = jnp.minimum(s.steps_B, self.max_new_tokens - 1)
      committed = committed.at[rows, step_B].set(
          jnp.where(active, n_B, committed[rows, step_B]))
    new = SpecState(cache=verify_out.cache.rollback(end_B + n_B),
                    pending_B=jnp.where(active, next_B, s.pending_B), out_BxN=out,
                    count_B=count, done_B=done, rng=rng, target_calls=s.target_calls + 1,
                    steps_B=s.steps_B + active, draft_state=draft_state, seq_BxS=seq,
                    accept_counts=s.accept_counts + hist, position_counts=position_counts,
                    budget_counts=s.budget_counts + budget_hist,
                    width_counts=s.width_counts + jax.nn.one_hot(width, k + 1,
                                                                 dtype=jnp.int32),
                    draft_stats=stats, committed_BxN=committed)
    return self.shard(new)

  def finish(self, final: SpecState) -> DecodeResult:
    budgeted = self.drafter.verify_widths is not None
    return self.result(final, final.accept_counts).replace(
        position_counts=final.position_counts,
        budget_counts=final.budget_counts if budgeted else None,
        width_counts=final.width_counts, draft_stats=final.draft_stats,
        committed_BxN=final.committed_BxN)
