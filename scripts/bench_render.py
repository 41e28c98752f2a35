"""Chat template rendering in packcli's sandbox: microseconds per dialogue, now and before.

Renders the same dialogues (made of real text: --from, as bench_pipeline --chat-from makes
them; generated text when the file is missing) with each template, through ``render_batch``
(what the chat path and its worker processes run), and with ``packcli/chat.py`` as it was
at ``--against`` (a git revision, loaded from git into this process), alternating the two so
both see the same machine. Prints the median of ``--runs`` runs per template and checks
that both give the same text and spans for every dialogue.

    python scripts/bench_render.py --from /tmp/real150.jsonl --dialogues 1000 --runs 5

Templates: the built-in ``chatml`` (generation tags: one render a dialogue), Meta's
Llama-3.1-8B-Instruct and Qwen2.5-Instruct (no tags: a second, sentinel render a dialogue),
from tests/assets.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from packcli import chat  # noqa: E402

ASSETS = ROOT / "tests" / "assets"
NOW = datetime(2024, 7, 26)
# The commit before the rendering speed-up (issue 13, item 4).
BEFORE = "5435524"

# The tokenizers' added tokens (the candidates for end-of-turn markers), as many as the real
# ones have: Llama-3.1 has 256, most of them reserved; Qwen2.5 has 22.
LLAMA_NAMED = (
    "<|begin_of_text|>", "<|end_of_text|>", "<|finetune_right_pad_id|>", "<|start_header_id|>",
    "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>",
)  # fmt: skip
LLAMA_CONTROLS = LLAMA_NAMED + tuple(f"<|reserved_special_token_{i}|>" for i in range(248))
QWEN_CONTROLS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
    "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>",
)  # fmt: skip
CHATML_CONTROLS = ("<|im_start|>", "<|im_end|>")  # bench_pipeline's chat tokenizer
# name -> (--chat-template, special tokens, control tokens)
TEMPLATES: dict[str, tuple[str, dict[str, str], tuple[str, ...]]] = {
    "chatml": ("chatml", {"eos_token": "<|im_end|>"}, CHATML_CONTROLS),
    "llama3.1": (
        str(ASSETS / "llama3.1_chat_template.jinja"),
        {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
        LLAMA_CONTROLS,
    ),
    "qwen2.5": (
        str(ASSETS / "qwen2.5_chat_template.jinja"),
        {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
        QWEN_CONTROLS,
    ),
}


def dialogues(source: Path, n: int, seed: int) -> list[list[dict[str, str]]]:
    """bench_pipeline's make_chat_corpus shapes: 30% with a system message, 1-4 exchanges."""
    rng = np.random.default_rng(seed)
    if source.is_file():
        with source.open("rb") as f:
            texts = (t for t in (json.loads(line)["text"] for line in f) if len(t) < 8000)
            pool = [next(texts) for _ in range(12 * n)]
    else:
        words = [
            "the",
            "of",
            "packing",
            "rows",
            "tokens",
            "dialogue",
            "café",
            "東京",
            "naïve",
            "model",
            "assistant",
        ]
        pool = [" ".join(rng.choice(words, int(rng.integers(5, 120)))) for _ in range(12 * n)]
    it = iter(pool)
    out = []
    for _ in range(n):
        msgs = []
        if rng.random() < 0.3:
            msgs.append({"role": "system", "content": next(it)[:300]})
        for _ in range(int(rng.choice([1, 1, 2, 2, 3, 4]))):
            msgs.append({"role": "user", "content": next(it)[:800]})
            msgs.append({"role": "assistant", "content": next(it)})
        out.append(msgs)
    return out


def load_before(revision: str) -> ModuleType:
    """packcli/chat.py at ``revision``, as a module of its own beside the current one."""
    text = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{revision}:packcli/chat.py"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    spec = importlib.util.spec_from_loader("packcli_chat_before", loader=None)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    module.__file__ = str(ROOT / "packcli" / "chat.py")  # resources.files("packcli") still works
    sys.modules[module.__name__] = module
    exec(compile(text, f"{revision}:packcli/chat.py", "exec"), module.__dict__)
    return module


def run_once(module: ModuleType, name: str, batch: list[Any]) -> tuple[float, list[Any]]:
    where, specials, controls = TEMPLATES[name]
    template = module.load_chat_template(None, where)
    started = time.perf_counter()
    rendered = module.render_batch(template, batch, specials, controls, now=NOW)
    return time.perf_counter() - started, [
        (i, r.text, r.assistant_spans, r.generation_spans) for i, r in rendered
    ]


def run_hf(name: str, batch: list[Any]) -> tuple[float, list[str]]:
    """transformers' own rendering (text only: no sandbox budgets, and no assistant spans
    for templates without generation tags), dialogue by dialogue as a dataset map does."""
    from transformers.utils.chat_template_utils import render_jinja_template

    where, specials, _ = TEMPLATES[name]
    text = chat.load_chat_template(None, where).text
    started = time.perf_counter()
    texts = [
        render_jinja_template(conversations=[m], chat_template=text, **specials)[0][0]
        for m in batch
    ]
    return time.perf_counter() - started, texts


def budgets(module: ModuleType, name: str, messages: list[Any]) -> list[int | None]:
    """The smallest steps, work and output budgets that render ``messages`` (bisection)."""
    where, specials, controls = TEMPLATES[name]
    template = module.load_chat_template(None, where)
    huge = {"steps": 10**9, "work": 10**9, "output": 10**9}
    found: list[int | None] = []
    for field in huge:

        def fits(value: int, field: str = field) -> bool:
            limits = dict(huge, steps_per_char=0, work_per_char=0, output_per_char=0)
            limits[field] = value
            try:
                module.render_batch(
                    template,
                    [messages],
                    specials,
                    controls,
                    limits=module.RenderLimits(**limits),
                    now=NOW,
                )
            except module.ChatTemplateError:
                return False
            return True

        low, high = 0, 1 << 26
        if not fits(high):
            found.append(None)
            continue
        while low < high:
            middle = (low + high) // 2
            low, high = (low, middle) if fits(middle) else (middle + 1, high)
        found.append(low)
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--from", dest="source", type=Path, default=Path("/tmp/real150.jsonl"))
    ap.add_argument("--dialogues", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--against", default=BEFORE, help="git revision of the 'before' chat.py")
    ap.add_argument("--templates", nargs="*", default=list(TEMPLATES))
    ap.add_argument(
        "--budgets",
        type=int,
        default=0,
        metavar="N",
        help="also check, on N dialogues, that the smallest budgets that render each one are "
        "the same as before (the meter counts every step and character as it did)",
    )
    args = ap.parse_args()

    batch = dialogues(args.source, args.dialogues, args.seed)
    kind = "real text" if args.source.is_file() else "generated text"
    messages = sum(map(len, batch)) / len(batch)
    chars = sum(len(m["content"]) for d in batch for m in d) / len(batch)
    print(
        f"{len(batch)} dialogues of {kind}: {messages:.1f} messages, {chars:,.0f} characters "
        f"on average; median of {args.runs} runs; before = packcli/chat.py at {args.against}"
    )
    before = load_before(args.against)
    print(
        "| template | HF text only us/dialogue | before us/dialogue | now us/dialogue "
        "| now vs before | now vs HF |\n|---|---|---|---|---|---|"
    )
    for name in args.templates:
        times: dict[str, list[float]] = {"hf": [], "before": [], "now": []}
        for k in range(args.runs + 1):  # the first round warms caches (compile, markers)
            seconds, texts = run_hf(name, batch)
            times["hf"].append(seconds)
            for label, module in (("before", before), ("now", chat)):
                seconds, outputs = run_once(module, name, batch)
                times[label].append(seconds)
                if k == 0 and label == "before":
                    expected = outputs
                    if [text for _, text, _, _ in outputs] != texts:
                        raise SystemExit(f"{name}: the texts differ from transformers'")
                elif k == 0 and outputs != expected:
                    raise SystemExit(f"{name}: the renderings differ from {args.against}'s")
        hf, old, new = (
            1e6 * statistics.median(times[x][1:]) / len(batch) for x in ("hf", "before", "now")
        )
        print(f"| {name} | {hf:.0f} | {old:.0f} | {new:.0f} | {old / new:.2f}x | {hf / new:.2f}x |")
    for name in args.templates if args.budgets else ():
        for messages in batch[: args.budgets]:
            old_budgets, new_budgets = (
                budgets(before, name, messages),
                budgets(chat, name, messages),
            )
            if old_budgets != new_budgets:
                raise SystemExit(f"{name}: budgets {new_budgets} != {old_budgets} before")
        print(f"{name}: smallest steps/work/output budgets as before on {args.budgets} dialogues")


if __name__ == "__main__":
    main()
