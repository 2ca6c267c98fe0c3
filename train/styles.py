"""Three more kinds of training prompt, in the forms users start a completion model with (data.py mixes them in):

    headers     a function's signature and the first line of its docstring, taken from the installed Python
                sources (ast), as a raw completion: the target writes the body itself (a continued snippet of
                library code, data.py's raw prompts, only ever continues code that exists)
    tasks       a one-line request in a comment, "// Go: <what to write>", the request a function's docstring
                summary from the same sources, the language drawn from TASK_LANGUAGES: the target writes the code
    problems    short arithmetic and logic word problems, built here from templates and random numbers, as a raw
                "Question: ... Answer:" completion or a chat request: the target reasons in prose

Why: the trainer's held-out acceptance (its own kinds of prompt) ran far above the acceptance on the benchmark's
prompts, which are mostly such headers, comment requests and questions (session 29: the 0.5B's drafter, chain walk
3.44 held out against 1.95). The benchmark prompts themselves are never used: the headers and tasks come from the
installed sources and the problems from the templates below, whose wording and numbers are this module's.
"""
from __future__ import annotations

import ast
import random
import re
from pathlib import Path

__all__ = ["function_headers", "comment_tasks", "word_problems", "PROBLEM_TEMPLATES", "TASK_LANGUAGES"]

MAX_HEADER_LINES = 8     # a signature longer than this (decorated, many parameters) is skipped
# A module-level def starts a line (a form feed or the file's byte-order mark may come first): a file without such
# a public one has no header to give, and is not parsed (ast.parse is most of the time spent here).
_PUBLIC_DEF = re.compile(r"^[\ufeff\f]?(?:async[ \t]+)?def[ \t]+(?!_|test)", re.M)


MAX_DOC_CHARS = 200      # the docstring's first paragraph, cut at a sentence's end within this


def _summary(doc: str) -> str | None:
    """The docstring's first paragraph on one line, cut after its first sentence that ends within MAX_DOC_CHARS."""
    para = " ".join(doc.strip().split("\n\n")[0].split())
    if not para or '"""' in para or "\\" in para:
        return None
    if len(para) > MAX_DOC_CHARS:
        cut = para.rfind(". ", 0, MAX_DOC_CHARS)
        if cut < 20:
            return None
        para = para[:cut + 1]
    return para


def _header(lines: list[str], node) -> str | None:
    """`def name(...):` + its docstring's summary, or None (no docstring, a long signature)."""
    body = node.body[0]
    if not (isinstance(body, ast.Expr) and isinstance(body.value, ast.Constant) and isinstance(body.value.value, str)):
        return None
    doc = _summary(body.value.value)
    sig = lines[node.lineno - 1:body.lineno - 1]
    if doc is None or not sig or len(sig) > MAX_HEADER_LINES or not sig[-1].rstrip().endswith(":"):
        return None
    return "\n".join(sig) + "\n" + " " * body.col_offset + '"""' + doc + '"""\n'


def function_headers(files: list[Path], rng: random.Random, n: int, per_file: int = 2) -> list[tuple[str, str]]:
    """Up to n (header text, origin "<path>:<name>") from the .py files, in the order of `files` (shuffle them
    first), at most per_file a file, drawn at random within a file: module-level functions with a docstring whose
    names do not start with "_" or "test" (what a user would ask to have written)."""
    return _from_functions(files, rng, n, per_file, lambda lines, node: _header(lines, node))


_MARKUP = re.compile(r"[`:|*<>{}\[\]]|\.\.|\bparam\b")
# the languages a comment task names, with their line-comment marker (the target writes the code after the line)
TASK_LANGUAGES = (("Python", "#"), ("Python", "#"), ("C", "//"), ("C++", "//"), ("JavaScript", "//"),
                  ("TypeScript", "//"), ("Go", "//"), ("Rust", "//"), ("Java", "//"))


def comment_tasks(files: list[Path], rng: random.Random, n: int, per_file: int = 2) -> list[tuple[str, str]]:
    """Up to n (text, origin) like function_headers', each a one-line request in a comment, as a user opens a file
    to have code written: "<marker> <Language>: <task>" + newline, the task a public function's docstring summary
    (its first letter lower-cased, its last period dropped), the language drawn from TASK_LANGUAGES."""
    def task(lines, node) -> str | None:
        body = node.body[0]
        if not (isinstance(body, ast.Expr) and isinstance(body.value, ast.Constant)
                and isinstance(body.value.value, str)):
            return None
        doc = _summary(body.value.value)
        if (doc is None or not 12 <= len(doc) <= 100 or not doc.split()[0].isalpha() or _MARKUP.search(doc)
                or "test" in doc.lower()):
            return None              # markup (reST roles, literals) and tests are not what a user asks for
        lang, marker = rng.choice(TASK_LANGUAGES)
        return f"{marker} {lang}: {doc[0].lower()}{doc[1:].rstrip('.')}\n"
    return _from_functions(files, rng, n, per_file, task)


def _from_functions(files: list[Path], rng: random.Random, n: int, per_file: int, make) -> list[tuple[str, str]]:
    """Up to n (make(lines, node), origin) over the module-level public functions of the .py files (see
    function_headers), make returning None to skip one."""
    out: list[tuple[str, str]] = []
    for path in files:
        if len(out) >= n:
            break
        try:
            text = path.read_text(encoding="utf-8")
            if not _PUBLIC_DEF.search(text):
                continue
            tree = ast.parse(text)
        except (OSError, UnicodeDecodeError, SyntaxError, ValueError, RecursionError):
            continue
        lines = text.splitlines()
        found = []
        for node in tree.body:
            if (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.body
                    and not node.name.startswith(("_", "test"))):
                h = make(lines, node)
                if h is not None:
                    found.append((h, f"{path.name}:{node.name}"))
        rng.shuffle(found)
        out.extend(found[:min(per_file, n - len(out))])
    return out


# {a}, {b}, {c}: random integers; {x}, {y}, {z}: random names; the answer is left to the target
PROBLEM_TEMPLATES = (
    "A bus leaves at {h1}:{m1:02d} and arrives at {h2}:{m2:02d}. How many minutes does the trip take?",
    "A box holds {a} apples. How many boxes are needed for {b} apples?",
    "{x} reads {a} pages a day. How many days does a book of {b} pages take?",
    "A square has an area of {sq} square metres. What is its perimeter?",
    "{x} has {a} coins and gives {y} one third of them, rounded down. How many coins does {x} keep?",
    "What is {a} percent of {b}?",
    "A price of {b} dollars rises by {p} percent and then falls by {p} percent. What is the final price?",
    "Is {n} divisible by 7? Show the division.",
    "What is the greatest common divisor of {a} and {b}?",
    "{x} is taller than {y}, and {z} is shorter than {y}. Who is the shortest?",
    "A tank fills in {a} hours with one pump and {b} hours with another. How long with both pumps?",
    "A car drives {a} km at {s1} km/h and then {b} km at {s2} km/h. What is its average speed?",
    "How many ways can {k} different books be arranged on a shelf?",
    "The sum of two numbers is {a} and their difference is {c}. What are the numbers?",
    "A recipe needs {a} grams of flour for {k} people. How much flour for {m} people?",
    "Convert {n} seconds into hours, minutes and seconds.",
    "What is the next number in the sequence {s0}, {s1_}, {s2_}, {s3_}, ...?",
    "Explain, step by step, how to find the median of {k} numbers.",
)
NAMES = ("Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Goran", "Hana", "Ivo", "Jun", "Kofi", "Lena", "Mateo", "Nia")


def word_problems(n: int, rng: random.Random, raw_fraction: float) -> list[tuple[str, bool]]:
    """n (text, chat) word problems: a template filled with random values; with probability raw_fraction a raw
    "Question: ...\\nAnswer:" completion (chat False), else the question alone as a chat request."""
    out = []
    for _ in range(n):
        t = rng.choice(PROBLEM_TEMPLATES)
        a, b = rng.randint(12, 480), rng.randint(20, 960)
        x, y, z = rng.sample(NAMES, 3)
        h1, h2 = rng.randint(6, 12), rng.randint(13, 21)
        s0, d = rng.randint(1, 20), rng.randint(2, 9)
        q = t.format(a=a, b=b, c=rng.randrange(a % 2, a, 2) if a > 2 else 0, x=x, y=y, z=z, h1=h1, m1=rng.randint(0, 59),
                     h2=h2, m2=rng.randint(0, 59), sq=rng.randint(2, 30) ** 2, p=rng.choice((5, 10, 15, 20, 25)),
                     n=rng.randint(100, 99999), s1=rng.choice((40, 50, 60, 80)), s2=rng.choice((30, 70, 90, 100)),
                     k=rng.randint(3, 9), m=rng.randint(2, 12), s0=s0, s1_=s0 + d, s2_=s0 + 2 * d + 1,
                     s3_=s0 + 3 * d + 3)
        raw = rng.random() < raw_fraction
        out.append((f"Question: {q}\nAnswer:" if raw else q, not raw))
    return out
