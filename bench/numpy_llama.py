"""A Llama / Qwen3 forward pass in plain numpy with a KV cache: the numpy peer of
bench/step_costs.py, on the same weights as a specjax target (float32)."""

from __future__ import annotations

import numpy as np
from flax import nnx


class NumpyLlama:
  """The target of a run as numpy matrices [in, out] (views of specjax's own layout)."""

  def __init__(self, model_cfg, params):
    import jax
    self.cfg = cfg = model_cfg
    flat = {path: np.asarray(jax.device_get(var.get_value()), np.float32)
            for path, var in nnx.to_flat_state(params)}
    d = cfg.d_model
    self.embedding = flat[("embedding",)]
    self.lm_head = self.embedding.T if cfg.tie_embeddings else flat[("lm_head",)]
    self.final_norm = flat[("final_norm", "scale")]
    self.layers = []
    for i in range(cfg.num_layers):
      p = lambda *k: flat[("blocks", i) + k]
      self.layers.append(dict(
          attn_norm=p("attn_norm", "scale"), mlp_norm=p("mlp_norm", "scale"),
          wq=p("attn", "wq").reshape(d, -1), wk=p("attn", "wk").reshape(d, -1),
          wv=p("attn", "wv").reshape(d, -1), wo=p("attn", "wo").reshape(-1, d),
          q_norm=flat.get(("blocks", i, "attn", "q_norm", "scale")),
          k_norm=flat.get(("blocks", i, "attn", "k_norm", "scale")),
          gate=p("mlp", "w_gate"), up=p("mlp", "w_up"), down=p("mlp", "w_down")))
    half = cfg.head_dim // 2
    self.inv_freq = cfg.rope_theta ** (-np.arange(half, dtype=np.float32) / half)

  def norm(self, x, scale):
    return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + self.cfg.norm_eps) * scale

  def rope(self, x_TxNxH, positions_T):
    angles = positions_T[:, None].astype(np.float32) * self.inv_freq
    sin, cos = np.sin(angles)[:, None], np.cos(angles)[:, None]
    x1, x2 = np.split(x_TxNxH, 2, axis=-1)
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)

  def new_cache(self, length: int):
    shape = (length, self.cfg.num_kv_heads, self.cfg.head_dim)
    return [(np.zeros(shape, np.float32), np.zeros(shape, np.float32)) for _ in self.layers]

  def __call__(self, tokens_T, cache, start: int):
    """Logits [T, V] of tokens at positions [start, start + T), written into `cache`."""
    cfg, t = self.cfg, len(tokens_T)
    hd, groups = cfg.head_dim, cfg.num_heads // cfg.num_kv_heads
    positions = np.arange(start, start + t)
    x = self.embedding[tokens_T]
    mask = np.arange(start + t)[None, :] <= positions[:, None]
    for layer, (k_cache, v_cache) in zip(self.layers, cache):
      h = self.norm(x, layer["attn_norm"])
      q = (h @ layer["wq"]).reshape(t, cfg.num_heads, hd)
      k = (h @ layer["wk"]).reshape(t, cfg.num_kv_heads, hd)
      v = (h @ layer["wv"]).reshape(t, cfg.num_kv_heads, hd)
      if layer["q_norm"] is not None:
        q, k = self.norm(q, layer["q_norm"]), self.norm(k, layer["k_norm"])
      k_cache[start:start + t], v_cache[start:start + t] = self.rope(k, positions), v
      q = self.rope(q, positions).reshape(t, cfg.num_kv_heads, groups, hd)
      keys, values = k_cache[:start + t], v_cache[:start + t]
      scores = np.einsum("tkgh,skh->kgts", q, keys) * hd**-0.5
      scores = np.where(mask, scores, -1e30)
      probs = np.exp(scores - scores.max(-1, keepdims=True))
      probs /= probs.sum(-1, keepdims=True)
      heads = np.einsum("kgts,skh->tkgh", probs, values).reshape(t, -1)
      x = x + heads @ layer["wo"]
      h = self.norm(x, layer["mlp_norm"])
      gate = h @ layer["gate"]
      x = x + (gate / (1 + np.exp(-gate)) * (h @ layer["up"])) @ layer["down"]
    return self.norm(x, self.final_norm) @ self.lm_head
