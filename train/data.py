"""Training prompts from what exists on the machine: source files installed with the interpreter.

Sources (`data_sources()`; the command prints them and writes them to the work folder):

    stdlib       the interpreter's standard library, *.py       (sysconfig "stdlib")
    site         the installed packages, *.py                   (sysconfig "purelib" and "platlib")
    include      the interpreter's C headers, *.h               (sysconfig "include")

Never used: anything inside the flashd repository (its bench/ prompt set, its tests), test folders of other
packages excluded only by size limits, nothing downloaded. A prompt is a snippet (12..60 lines) of one file and
one task, e.g. "Explain what this code does", "Continue this code", "Write a function like this one that ...",
rendered through the target's chat template; a share (`raw_fraction`) are raw completions: the snippet's first
lines, which the model continues as plain text (how bench/bench_spec.py prompts, without its prompts).
The answers are the target's own (generate.py): self-distillation.
"""
from __future__ import annotations

import random
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from .styles import comment_tasks, function_headers, word_problems

__all__ = ["Prompt", "Source", "data_sources", "source_files", "build_prompts", "REPO_ROOT"]

REPO_ROOT = Path(__file__).resolve().parents[1]     # the flashd checkout: never a data source

MAX_FILE_BYTES = 400_000
MAX_SNIPPET_CHARS = 2400

PY_TASKS = (
    "Explain what this Python code does, step by step:\n\n```python\n{code}\n```",
    "Continue this Python code:\n\n```python\n{code}\n```",
    "Write a function similar to the code below that solves a related problem, with a docstring:\n\n"
    "```python\n{code}\n```",
    "Write pytest unit tests for this code:\n\n```python\n{code}\n```",
    "Refactor this code for readability and add type hints:\n\n```python\n{code}\n```",
    "Find possible bugs or edge cases in this code and fix them:\n\n```python\n{code}\n```",
    "Add docstrings and comments to this code:\n\n```python\n{code}\n```",
    "Rewrite this Python code in C:\n\n```python\n{code}\n```",
)
C_TASKS = (
    "Explain these C declarations:\n\n```c\n{code}\n```",
    "Write a small C program that uses the declarations below:\n\n```c\n{code}\n```",
    "Write Python ctypes bindings for these C declarations:\n\n```c\n{code}\n```",
    "Continue this C header:\n\n```c\n{code}\n```",
)

# data_mix "wide" (TrainConfig.data_mix): answers in the languages users start the target in, and prose. Python
# snippets may also be translated (the answer is then Rust, Go, ...), C++ from the packages' headers and sources,
# and the packages' documentation (.rst / .md) explained, summarised or continued as plain text.
LANGS = ("Rust", "Go", "JavaScript", "TypeScript", "Java", "C++", "a bash script", "SQL where it fits, or Python")
WIDE_PY_TASKS = tuple(f"Rewrite this Python code in {lang}:\n\n```python\n{{code}}\n```" for lang in LANGS) + (
    "Write a short tutorial, in prose with small examples, explaining the ideas behind this code:\n\n"
    "```python\n{code}\n```",
)
CPP_TASKS = (
    "Explain what this C++ code does:\n\n```cpp\n{code}\n```",
    "Continue this C++ code:\n\n```cpp\n{code}\n```",
    "Write a small program that uses the code below, with comments:\n\n```cpp\n{code}\n```",
    "Rewrite this C++ code in Rust:\n\n```cpp\n{code}\n```",
    "Rewrite this C++ code in Go:\n\n```cpp\n{code}\n```",
    "Find possible bugs in this C++ code and explain them:\n\n```cpp\n{code}\n```",
)
DOC_TASKS = (
    "Summarise this documentation in five bullet points:\n\n{code}",
    "Explain this to a new programmer, step by step, with an example:\n\n{code}",
    "Write a short code example that shows what this documentation describes:\n\n{code}",
    "What questions would a user have after reading this? Answer each of them:\n\n{code}",
)
DATA_MIXES = ("code", "wide")


@dataclass(slots=True, frozen=True)
class Source:
    kind: str       # stdlib | site | include
    root: Path
    suffix: str     # ".py" or ".h"


@dataclass(slots=True, frozen=True)
class Prompt:
    task: str       # "{code}" for a raw completion, else a task with a {code} slot (a user message)
    code: str       # the snippet
    origin: str     # "<source kind>:<path relative to its root>:<first line>"

    @property
    def chat(self) -> bool:
        """True: render through the chat template; False: raw completion."""
        return self.task != "{code}"

    @property
    def text(self) -> str:
        return self.task.format(code=self.code)

    def shortened(self) -> "Prompt | None":
        """The same task on the first half of the snippet (None below 6 lines): for prompts over the limit."""
        lines = self.code.splitlines()
        return None if len(lines) < 12 else Prompt(self.task, "\n".join(lines[:len(lines) // 2]) + "\n", self.origin)


def _inside(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root)
        return True
    except ValueError:
        return False


def data_sources(mix: str = "code") -> list[Source]:
    """The source folders, in order, without duplicates and without the flashd repository. mix "code": Python
    (stdlib, site-packages) and the interpreter's C headers; "wide" adds the packages' C / C++ headers and
    sources (kind "cpp") and their documentation (kind "docs", .rst and .md)."""
    if mix not in DATA_MIXES:
        raise ValueError(f"data mix {mix!r}: one of {', '.join(DATA_MIXES)}")
    paths = sysconfig.get_paths()
    out: list[Source] = []
    seen: set[Path] = set()
    for kind, key, suffix in (("stdlib", "stdlib", ".py"), ("site", "purelib", ".py"), ("site", "platlib", ".py"),
                              ("include", "include", ".h")):
        root = Path(paths.get(key, "")).resolve()
        if not root.is_dir() or root in seen or _inside(root, REPO_ROOT):
            continue
        seen.add(root)
        out.append(Source(kind, root, suffix))
    if mix == "wide":
        extra: set[tuple[Path, str]] = set()
        for kind, suffixes in (("cpp", (".h", ".hpp", ".cuh", ".cpp", ".cc")), ("docs", (".rst", ".md"))):
            for key in ("purelib", "platlib"):
                root = Path(paths.get(key, "")).resolve()
                for suffix in suffixes:
                    if root.is_dir() and (root, suffix) not in extra and not _inside(root, REPO_ROOT):
                        extra.add((root, suffix))
                        out.append(Source(kind, root, suffix))
    return out


def source_files(source: Source) -> list[Path]:
    """The source's files, sorted; nothing inside the flashd repository, nothing over MAX_FILE_BYTES.
    The stdlib source skips site-packages (its own source)."""
    files = []
    in_repo: dict[Path, bool] = {}      # a folder's answer, resolved once: a file that is no link resolves inside it
    for p in sorted(source.root.rglob(f"*{source.suffix}")):
        if "site-packages" in p.parts and source.kind == "stdlib":
            continue
        try:
            if not p.is_file() or p.stat().st_size > MAX_FILE_BYTES:
                continue
            if p.parent not in in_repo:
                in_repo[p.parent] = _inside(p.parent, REPO_ROOT)
            if in_repo[p.parent] or (p.is_symlink() and _inside(p, REPO_ROOT)):
                continue
        except OSError:
            continue
        files.append(p)
    return files


def _snippets(text: str, rng: random.Random, n: int) -> Iterator[str]:
    """Up to n snippets of 12..60 lines starting at a non-blank, unindented-ish line."""
    lines = text.splitlines()
    if len(lines) < 8:
        return
    starts = [i for i, line in enumerate(lines) if line.strip() and len(line) - len(line.lstrip()) <= 4]
    rng.shuffle(starts)
    for s in starts[:n]:
        chunk = "\n".join(lines[s:s + rng.randint(12, 60)]).strip("\n")
        if len(chunk) > MAX_SNIPPET_CHARS:
            chunk = chunk[:MAX_SNIPPET_CHARS].rsplit("\n", 1)[0]
        if chunk.count("\n") >= 5:
            yield chunk


def _tasks(src: Source, mix: str) -> tuple[str, ...]:
    if src.kind == "docs":
        return DOC_TASKS
    if src.kind == "cpp":
        return CPP_TASKS
    if src.suffix == ".py":
        return PY_TASKS + WIDE_PY_TASKS if mix == "wide" else PY_TASKS
    return C_TASKS


def _wide_extra_tasks(src: Source) -> tuple[str, ...]:
    """What "wide" adds to "code": its C++ and docs sources' tasks, and the translations / tutorial of a Python
    snippet (C headers: none)."""
    if src.kind in ("docs", "cpp"):
        return _tasks(src, "wide")
    return WIDE_PY_TASKS if src.suffix == ".py" else ()


def _draw(n: int, rng: random.Random, sources: list[Source], tasks_of, raw_of, per_file: int) -> list[Prompt]:
    """Up to n prompts: the sources' files shuffled, `per_file` snippets each; a snippet becomes a raw completion
    (its first half) with probability raw_of(src), else a task drawn from tasks_of(src)."""
    files = [(src, p) for src in sources for p in source_files(src)]
    rng.shuffle(files)
    prompts: list[Prompt] = []
    for src, path in files:
        if len(prompts) >= n:
            break
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        for code in _snippets(text, rng, per_file):
            origin = f"{src.kind}:{path.relative_to(src.root)}:{code.splitlines()[0][:60]}"
            if rng.random() < raw_of(src):    # raw completion: the first half of the snippet
                lines = code.splitlines()
                prompts.append(Prompt("{code}", "\n".join(lines[:max(6, len(lines) // 2)]) + "\n", origin))
            else:
                prompts.append(Prompt(rng.choice(tasks_of(src)), code, origin))
            if len(prompts) >= n:
                break
    return prompts


def build_prompts(n: int, seed: int = 0, raw_fraction: float = 0.5, per_file: int = 2, mix: str = "code",
                  wide_fraction: float = 0.0, header_fraction: float = 0.0, problem_fraction: float = 0.0,
                  task_fraction: float = 0.0) -> list[Prompt]:
    """n prompts, deterministic for (machine's sources, seed, mix, fractions): files shuffled over every source,
    `per_file` snippets each, a task drawn per snippet (data_sources(mix); "code" draws exactly as before "wide"
    existed). Shares of the n prompts may be other kinds, the rest mix's own first prompts, all interleaved by a
    seeded shuffle: wide_fraction (mix "code" only) what "wide" adds (its C++ and docs sources -- raw completions
    of them at raw_fraction, docs continued as prose -- and Python snippets asked for a translation or a
    tutorial); header_fraction function headers from the Python sources, raw (styles.function_headers);
    problem_fraction word problems from styles.py's templates, raw at raw_fraction, else chat; task_fraction
    one-line requests in a comment (styles.comment_tasks), raw."""
    fractions = (wide_fraction, header_fraction, problem_fraction, task_fraction)
    if not all(0.0 <= f <= 1.0 for f in fractions) or sum(fractions) > 1.0:
        raise ValueError(f"wide_fraction, header_fraction, problem_fraction, task_fraction must be in [0, 1] and sum "
                         f"to <= 1, got {fractions}")
    if wide_fraction and mix == "wide":
        raise ValueError("wide_fraction draws what mix 'wide' adds to 'code': use it with mix 'code'")
    n_wide, n_head, n_prob, n_task = (round(n * f) for f in fractions)
    out = _draw(n - n_wide - n_head - n_prob - n_task, random.Random(seed), data_sources(mix),
                lambda src: _tasks(src, mix), lambda src: raw_fraction, per_file)
    if not (n_wide or n_head or n_prob or n_task):
        return out
    if n_wide:
        extra_sources = [s for s in data_sources("wide") if _wide_extra_tasks(s)]
        out += _draw(n_wide, random.Random(f"{seed}:wide"), extra_sources, _wide_extra_tasks,
                     lambda src: raw_fraction if src.kind in ("docs", "cpp") else 0.0, per_file)
    py_files = ([p for src in data_sources("code") if src.suffix == ".py" for p in source_files(src)]
                if n_head or n_task else [])
    if n_head:
        rng = random.Random(f"{seed}:headers")
        files = list(py_files)
        rng.shuffle(files)
        out += [Prompt("{code}", text, f"headers:{origin}") for text, origin in function_headers(files, rng, n_head)]
    if n_task:
        rng = random.Random(f"{seed}:tasks")
        files = list(py_files)
        rng.shuffle(files)
        out += [Prompt("{code}", text, f"tasks:{origin}") for text, origin in comment_tasks(files, rng, n_task)]
    if n_prob:
        for i, (text, chat) in enumerate(word_problems(n_prob, random.Random(f"{seed}:problems"), raw_fraction)):
            out.append(Prompt(text, "", f"problems:{i}") if chat else Prompt("{code}", text, f"problems:{i}"))
    random.Random(f"{seed}:blend").shuffle(out)
    return out
