"""Finding the chat template the way transformers does, and the variables it is given.

Why: the only faithful source for "what the assistant says" is the model's own template, so
it is looked for where transformers looks (``--chat-template``, then beside the tokenizer,
then on the Hub), and compiled in the sandbox once here, so that a broken or hostile
template fails before any input is read.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from packcli.chat.errors import ChatTemplateError
from packcli.chat.execute import compile_template
from packcli.tokenize.tokenizer import config_candidates, hub_file

log = logging.getLogger(__name__)


_ASSETS = resources.files("packcli") / "assets"


@dataclass(frozen=True)
class ChatTemplate:
    source: str  # where the text came from, for messages and the run record
    text: str

    @property
    def has_generation_tags(self) -> bool:
        return compile_template(self.text, self.source).has_generation


def builtin_templates() -> list[str]:
    """Names of the templates shipped as ``packcli/assets/<name>.jinja``."""
    return sorted(
        p.name.removesuffix(".jinja") for p in _ASSETS.iterdir() if p.name.endswith(".jinja")
    )


def _builtin(name: str) -> ChatTemplate | None:
    resource = _ASSETS / f"{name}.jinja"
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name) or not resource.is_file():
        return None
    return ChatTemplate(f"built-in {name}", resource.read_text(encoding="utf-8"))


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ChatTemplateError(f"cannot read {path}: {exc}") from exc
    return data if isinstance(data, dict) else {}


def _config_templates(config: dict[str, Any], where: str) -> dict[str, ChatTemplate]:
    """``chat_template`` of a tokenizer config: a string, or a list of {name, template}."""
    value = config.get("chat_template")
    if isinstance(value, str):
        return {"default": ChatTemplate(f"'chat_template' in {where}", value)}
    found = {}
    if isinstance(value, list):
        for entry in value:
            if isinstance(entry, dict) and isinstance(entry.get("template"), str):
                name = str(entry.get("name", "default"))
                found[name] = ChatTemplate(f"chat template {name!r} in {where}", entry["template"])
    elif value is not None:
        raise ChatTemplateError(f"'chat_template' in {where} is neither a string nor a list")
    return found


def _tokenizer_templates(spec: str) -> tuple[dict[str, ChatTemplate], list[str]]:
    """Templates that come with a tokenizer (name -> template; the main one is "default"),
    and the places looked at, for the error message when there are none."""
    path = Path(spec)
    if path.is_dir() or path.is_file():
        folder = path if path.is_dir() else path.parent
        looked = [str(folder / "chat_template.jinja")]
        templates: dict[str, ChatTemplate] = {}
        for config_path in config_candidates(path / "tokenizer.json" if path.is_dir() else path):
            looked.append(f"'chat_template' in {config_path}")
            if config_path.is_file():
                templates = _config_templates(_read_json(config_path), str(config_path))
                break
        extra = folder / "additional_chat_templates"
        if extra.is_dir():
            for file in sorted(extra.glob("*.jinja")):
                text = file.read_text(encoding="utf-8")
                templates[file.name.removesuffix(".jinja")] = ChatTemplate(str(file), text)
        main = folder / "chat_template.jinja"
        if main.is_file():  # transformers: the .jinja file wins over the config's string
            templates["default"] = ChatTemplate(str(main), main.read_text(encoding="utf-8"))
        return templates, looked
    if spec.startswith((".", "/")) or spec.endswith(".json"):
        return {}, [f"{spec} (no such file or folder)"]
    return _hub_templates(spec)


def _hub_templates(repo_id: str) -> tuple[dict[str, ChatTemplate], list[str]]:
    looked = [f"chat_template.jinja and tokenizer_config.json of Hub repo {repo_id}"]
    for name in ("chat_template.jinja", "tokenizer_config.json"):
        file = hub_file(repo_id, name)
        if file is None:  # try the next place
            continue
        if name.endswith(".jinja"):
            text = file.read_text(encoding="utf-8")
            return {"default": ChatTemplate(f"{repo_id}/{name}", text)}, looked
        return _config_templates(_read_json(file), f"{repo_id}/{name}"), looked
    return {}, looked


def load_chat_template(tokenizer_spec: str | None, override: str | None) -> ChatTemplate:
    """Find the chat template the way transformers does, and check that it compiles.

    ``override`` (``--chat-template``) wins: inline Jinja text, a ``.jinja`` file, a
    ``tokenizer_config.json``-style ``.json`` file, the name of one of the tokenizer's named
    templates, or a built-in name (``builtin_templates()``, e.g. ``chatml``). Without it:
    ``chat_template.jinja`` beside the tokenizer, else ``chat_template`` in
    ``tokenizer_config.json`` (or ``<stem>_config.json`` beside ``<stem>.json``); a list of
    named templates yields the one named "default".
    """
    template = _find_template(tokenizer_spec, override)
    if not template.text.strip():
        raise ChatTemplateError(f"chat template ({template.source}) is empty")
    compile_template(template.text, template.source)
    return template


def _find_template(tokenizer_spec: str | None, override: str | None) -> ChatTemplate:
    if override and ("{{" in override or "{%" in override):
        return ChatTemplate("inline template", override)
    if override and Path(override).is_file():
        path = Path(override)
        if path.suffix == ".json":
            found = _config_templates(_read_json(path), str(path))
            if "default" not in found:
                raise ChatTemplateError(f"{path} has no default 'chat_template'")
            return found["default"]
        return ChatTemplate(str(path), path.read_text(encoding="utf-8"))
    # Only now look beside the tokenizer (for a Hub id, that is a download).
    templates, looked = _tokenizer_templates(tokenizer_spec) if tokenizer_spec else ({}, [])
    if override:
        if override in templates:
            return templates[override]
        builtin = _builtin(override)
        if builtin is not None:
            return builtin
        if "/" in override or Path(override).suffix in (".jinja", ".json"):
            raise ChatTemplateError(f"chat template file not found: {override}")
        named = ", ".join(sorted(templates)) or "none"
        raise ChatTemplateError(
            f"unknown chat template {override!r}: pass a .jinja file, one of the tokenizer's "
            f"templates ({named}) or a built-in ({', '.join(builtin_templates())})"
        )
    if "default" in templates:
        return templates["default"]
    if templates:
        raise ChatTemplateError(
            f"the tokenizer has chat templates named {', '.join(sorted(templates))} but none "
            "named 'default': pass --chat-template NAME"
        )
    where = f" (looked for {', '.join(looked)})" if looked else ""
    raise ChatTemplateError(
        f"no chat template found{where}: pass --chat-template with a .jinja file or a "
        f"built-in ({', '.join(builtin_templates())})"
    )


def special_tokens_from_config(config: Mapping[str, Any]) -> dict[str, str]:
    """``*_token`` entries of a ``tokenizer_config.json`` (strings or AddedToken dicts), the
    template variables transformers passes (``bos_token``, ``eos_token``...)."""
    found = {}
    for key, value in config.items():
        if isinstance(value, dict):
            value = value.get("content")
        if key.endswith("_token") and isinstance(value, str):
            found[key] = value
    return found
