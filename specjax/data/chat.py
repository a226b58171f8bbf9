"""The target checkpoint's own chat template (`--config.chat_template=true`).

Rendered as transformers' `apply_chat_template(messages, add_generation_prompt=True)` renders
it (transformers/utils/chat_template_utils.py: a sandboxed jinja2 environment with trim_blocks,
lstrip_blocks, loopcontrols, its own `tojson`, `raise_exception`, `strftime_now`, and the
tokenizer's special token strings as variables), and encoded as it tokenizes: the rendered text
already holds every special token, so none is added (no post-processor BOS, no run BOS).

The template: run_dir/target/chat_template.jinja (written by the GGUF importer), else the
`chat_template` of run_dir/target/hf/tokenizer_config.json (kept by import-hf).
"""

from __future__ import annotations

import dataclasses
import json
import os
from datetime import datetime

from tokenizers import Tokenizer

from specjax import run_dir as run_dir_lib
from specjax.data import tokenizer as tokenizer_lib
from specjax.errors import SpecjaxError

TEMPLATE_FILE = "chat_template.jinja"
SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                      "cls_token", "mask_token")
NO_TEMPLATE = "the target has no chat template; run without --config.chat_template"


@dataclasses.dataclass(frozen=True)
class ChatTemplate:
  """A compiled template and the special token strings it sees (bos_token, eos_token, ...)."""
  compiled: object
  special_tokens: dict
  source: str

  def render(self, messages: list[dict]) -> str:
    import jinja2
    try:
      return self.compiled.render(messages=messages, tools=None, documents=None,
                                  add_generation_prompt=True, **self.special_tokens)
    except jinja2.TemplateError as e:
      raise SpecjaxError(f"the chat template of {self.source} failed: {e}") from None


def conversation(user_turns, answers=()) -> list[dict]:
  """The messages of a conversation: each user turn but the last followed by the target's
  answer to it."""
  out = []
  for user, answer in zip(user_turns[:-1], answers, strict=True):
    out += [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
  return out + [{"role": "user", "content": user_turns[-1]}]


def render_prompts(template: ChatTemplate, prompts, tok: Tokenizer, answer) -> list[str]:
  """The chat text of every benchmark prompt. Earlier user turns (MT-Bench turn 1) get the
  target's own answers, turn by turn: answer(list of ids) -> the output ids of each."""
  answers = [[] for _ in prompts]
  for turn in range(max(len(p.earlier) for p in prompts)):
    rows = [i for i, p in enumerate(prompts) if len(p.earlier) > turn]
    asked = [template.render(conversation(prompts[i].earlier[:turn + 1], answers[i]))
             for i in rows]
    for i, ids in zip(rows, answer([encode(tok, text) for text in asked])):
      answers[i].append(tokenizer_lib.decode(tok, ids))
  return [template.render(conversation(p.earlier + (p.user,), a))
          for p, a in zip(prompts, answers)]


def encode(tok: Tokenizer, text: str) -> list[int]:
  """apply_chat_template's tokenization: the rendered text, no special tokens added."""
  return tok.encode(text, add_special_tokens=False).ids


def load(run_dir: str, tok: Tokenizer, special: tokenizer_lib.SpecialIds) -> ChatTemplate:
  text, source = find_template(run_dir)
  tokens = special_tokens(run_dir, tok, special)
  return ChatTemplate(compile_template(text, source), tokens, source)


def find_template(run_dir: str) -> tuple[str, str]:
  """(template text, where it came from)."""
  folder = run_dir_lib.model_dir(run_dir, "target")
  path = os.path.join(folder, TEMPLATE_FILE)
  if os.path.exists(path):
    with open(path, encoding="utf-8") as f:
      return f.read(), path
  path = os.path.join(folder, "hf", "tokenizer_config.json")
  template = read_json(path).get("chat_template")
  if isinstance(template, list):  # named templates: apply_chat_template uses "default"
    template = {t.get("name"): t.get("template") for t in template}.get("default")
  if not isinstance(template, str) or not template.strip():
    raise SpecjaxError(NO_TEMPLATE)
  return template, path


def special_tokens(run_dir: str, tok: Tokenizer, special: tokenizer_lib.SpecialIds) -> dict:
  """The special token strings transformers passes the template: those of the kept
  tokenizer_config.json / special_tokens_map.json, else BOS and EOS by the run's ids."""
  hf = os.path.join(run_dir_lib.model_dir(run_dir, "target"), "hf")
  kept = {**read_json(os.path.join(hf, "special_tokens_map.json")),
          **read_json(os.path.join(hf, "tokenizer_config.json"))}
  out = {k: token_text(kept[k]) for k in SPECIAL_TOKEN_KEYS if token_text(kept.get(k))}
  if not out:
    ids = {"bos_token": special.bos_id, "eos_token": special.eos_id}
    out = {k: tok.id_to_token(i) for k, i in ids.items()
           if i is not None and tok.id_to_token(i) is not None}
  return out


def token_text(value) -> str | None:
  """A special token as tokenizer_config.json writes it: a string or an AddedToken dict."""
  return value.get("content") if isinstance(value, dict) else value


def read_json(path: str) -> dict:
  if not os.path.exists(path):
    return {}
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except json.JSONDecodeError as e:
    raise SpecjaxError(f"{path} is not JSON ({e.msg})") from None


def compile_template(text: str, source: str):
  """transformers' jinja environment, without its assistant-token tracking."""
  try:
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment
  except ImportError:
    raise SpecjaxError("--config.chat_template needs jinja2; install it with: "
                       "pip install jinja2") from None

  def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)

  def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # jinja's own tojson escapes HTML characters; transformers' does not
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)

  env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                      extensions=[generation_tag(jinja2), jinja2.ext.loopcontrols])
  env.filters["tojson"] = tojson
  env.globals["raise_exception"] = raise_exception
  env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
  try:
    return env.from_string(text)
  except jinja2.TemplateSyntaxError as e:
    raise SpecjaxError(f"the chat template of {source} does not parse: {e} (line {e.lineno})"
                       ) from None


def generation_tag(jinja2):
  """`{% generation %}...{% endgeneration %}`, which transformers' templates may use to mark
  assistant text for training masks: rendered as its body."""

  class Generation(jinja2.ext.Extension):
    tags = {"generation"}

    def parse(self, parser):
      lineno = next(parser.stream).lineno
      body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
      return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
      return caller()

  return Generation
