"""The training data's sources: installed Python / C sources only, never the flashd repository (its bench/
prompt set in particular); the rendered prompts contain no benchmark prompt."""
from __future__ import annotations

import json
import re
from pathlib import Path

from flashd.train.data import REPO_ROOT, build_prompts, data_sources

BENCH_PROMPTS = REPO_ROOT / "bench" / "spec_prompts.jsonl"


def test_sources_are_installed_files_outside_the_repository():
    sources = data_sources()
    assert {s.kind for s in sources} >= {"stdlib"}
    for s in sources:
        assert REPO_ROOT not in s.root.parents and s.root != REPO_ROOT


def test_prompts_contain_no_benchmark_prompt():
    prompts = build_prompts(400, seed=1)
    assert len(prompts) == 400
    bench = [json.loads(line)["text"].strip() for line in BENCH_PROMPTS.read_text().splitlines() if line.strip()]
    assert bench
    for p in prompts:
        kind, rel, _ = p.origin.split(":", 2)
        assert kind in ("stdlib", "site", "include") and not Path(rel).is_absolute()
        assert not any(b in p.text for b in bench), p.origin
    assert any(p.chat for p in prompts) and any(not p.chat for p in prompts)


def test_the_daemon_and_cli_never_import_torch():
    """torch is an optional extra: importing the CLI (which registers train-drafter) and the daemon loads no torch."""
    import subprocess
    import sys
    code = ("import sys, flashd.clients.cli, flashd.daemon.server, flashd.train.data, flashd.train.command; "
            "sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_the_wide_mix_adds_cpp_and_docs_and_other_answer_languages():
    """data_mix "wide": the packages' C++ and docs join (where installed), Python snippets may ask for a translation,
    still no benchmark prompt; "code" draws exactly the prompts it drew before "wide" existed (same tasks, same
    random draws: the shipped drafter's data)."""
    import pytest
    from flashd.train.data import CPP_TASKS, DOC_TASKS, PY_TASKS, WIDE_PY_TASKS
    code = build_prompts(300, seed=2)
    assert all(p.origin.split(":", 1)[0] in ("stdlib", "site", "include") for p in code)
    assert all(p.task in PY_TASKS or p.task == "{code}" or p.origin.startswith("include") for p in code)
    kinds = {s.kind for s in data_sources("wide")}
    assert kinds >= {s.kind for s in data_sources()}
    wide = build_prompts(2000, seed=2, mix="wide")
    bench = [json.loads(line)["text"].strip() for line in BENCH_PROMPTS.read_text().splitlines() if line.strip()]
    for p in wide:
        assert not any(b in p.text for b in bench), p.origin
    tasks = {p.task for p in wide}
    assert tasks & set(WIDE_PY_TASKS)
    if "cpp" in kinds:
        assert any(p.origin.startswith("cpp:") for p in wide) and tasks & set(CPP_TASKS)
    if "docs" in kinds:
        assert any(p.origin.startswith("docs:") for p in wide) and tasks & set(DOC_TASKS)
    with pytest.raises(ValueError, match="data mix"):
        data_sources("everything")


def test_a_wide_fraction_blends_what_wide_adds_into_code():
    """wide_fraction F with mix "code": round(F n) prompts are what "wide" adds (C++ / docs sources, Python
    translated or explained in prose), the rest exactly "code"'s first prompts, the lists interleaved; F = 0 is
    "code" itself; deterministic; no benchmark prompt; out-of-range fractions refused."""
    import pytest
    from flashd.train.data import C_TASKS, PY_TASKS, WIDE_PY_TASKS
    from flashd.train.recipe import TrainConfig
    assert build_prompts(200, seed=3, wide_fraction=0.0) == build_prompts(200, seed=3)
    blend = build_prompts(400, seed=3, wide_fraction=0.25)
    assert len(blend) == 400 and blend == build_prompts(400, seed=3, wide_fraction=0.25)
    extra = [p for p in blend if p.origin.split(":", 1)[0] in ("cpp", "docs") or p.task in WIDE_PY_TASKS]
    assert len(extra) == 100
    rest = [p for p in blend if p not in extra]
    assert sorted(rest, key=repr) == sorted(build_prompts(300, seed=3), key=repr)
    assert all(p.task in PY_TASKS + C_TASKS or p.task == "{code}" for p in rest)
    bench = [json.loads(line)["text"].strip() for line in BENCH_PROMPTS.read_text().splitlines() if line.strip()]
    assert not any(b in p.text for p in blend for b in bench)
    with pytest.raises(ValueError, match="wide_fraction"):
        build_prompts(10, wide_fraction=1.5)
    with pytest.raises(ValueError, match="wide_fraction"):
        TrainConfig(wide_fraction=0.2, data_mix="wide")
    assert TrainConfig(wide_fraction=0.2).sources_mix == "wide" and TrainConfig(wide_fraction=0.0).sources_mix == "code"


def test_headers_and_problems_join_as_shares():
    """header_fraction / problem_fraction: those shares of the prompts are function headers from the installed
    Python sources (a def line and its docstring's first line, completed raw) and word problems from styles.py's
    templates (raw "Question: ... Answer:" or chat); the rest the mix's own first prompts; none contains a benchmark
    prompt; shares summing over 1 are refused."""
    import ast

    import pytest
    mixed = build_prompts(300, seed=4, header_fraction=0.2, problem_fraction=0.1)
    assert len(mixed) == 300 and mixed == build_prompts(300, seed=4, header_fraction=0.2, problem_fraction=0.1)
    heads = [p for p in mixed if p.origin.startswith("headers:")]
    probs = [p for p in mixed if p.origin.startswith("problems:")]
    assert len(heads) == 60 and len(probs) == 30
    for p in heads:
        assert not p.chat and p.text.startswith(("def ", "async def ")) and p.text.rstrip().endswith('"""')
        ast.parse(p.text + "    pass\n" if p.text.startswith("def") else p.text.replace("async ", "") + "    pass\n")
    assert all("Question:" in p.text or p.chat for p in probs)
    assert any(p.chat for p in probs) and any(not p.chat for p in probs)
    rest = [p for p in mixed if p not in heads and p not in probs]
    assert sorted(rest, key=repr) == sorted(build_prompts(210, seed=4), key=repr)
    bench = [json.loads(line)["text"].strip() for line in BENCH_PROMPTS.read_text().splitlines() if line.strip()]
    assert not any(b in p.text or p.text.strip() in b for p in heads + probs for b in bench)
    with pytest.raises(ValueError, match="sum to"):
        build_prompts(10, header_fraction=0.6, problem_fraction=0.5)


def test_header_files_without_a_public_def_are_not_parsed(tmp_path, monkeypatch):
    """function_headers skips a file whose text has no line starting a public module-level def (styles._PUBLIC_DEF)
    without parsing it, and that changes nothing: the same headers as parsing every file, on crafted edge cases
    (a form feed or byte-order mark before the def, async, decorated, indented defs, private names) and the first
    400 stdlib files."""
    import random
    import sysconfig

    from flashd.train import styles
    cases = {
        "ff.py": '\fdef ff(x):\n    """Form feed first."""\n',
        "bom.py": '\ufeffdef bom(x):\n    """Mark first."""\n',
        "asy.py": 'async  def run(x):\n    """Awaits x."""\n',
        "deco.py": '@staticmethod\ndef deco(x):\n    """Decorated."""\n',
        "inner.py": 'class A:\n    def m(self):\n        """Method."""\n\nif True:\n    def g():\n        """Nested."""\n',
        "priv.py": 'def _p():\n    """Private."""\n\ndef test_t():\n    """A test."""\n',
    }
    files = []
    for name, text in cases.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
        files.append(tmp_path / name)
    stdlib = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:400]
    for batch in (files, files + stdlib):
        got = styles.function_headers(batch, random.Random(5), 10_000)
        with monkeypatch.context() as m:
            m.setattr(styles, "_PUBLIC_DEF", re.compile(""))         # matches every text: parse them all
            want = styles.function_headers(batch, random.Random(5), 10_000)
        assert got == want
    names = {o.split(":")[1] for _, o in styles.function_headers(files, random.Random(5), 100)}
    assert names == {"run", "deco"}          # the form feed / mark files reach ast (which gives none of them)
    assert all(styles._PUBLIC_DEF.search(t) for n, t in cases.items() if n in ("ff.py", "bom.py", "asy.py", "deco.py"))
    assert not any(styles._PUBLIC_DEF.search(t) for n, t in cases.items() if n in ("inner.py", "priv.py"))


def test_comment_tasks_join_as_a_share():
    """task_fraction: that share of the prompts is one-line requests in a comment ("// Go: <task>"), the task a
    public function's docstring summary from the installed Python sources without markup, completed raw; the rest
    the mix's own; none contains a benchmark prompt."""
    import pytest

    from flashd.train.styles import TASK_LANGUAGES
    mixed = build_prompts(300, seed=4, task_fraction=0.2)
    assert mixed == build_prompts(300, seed=4, task_fraction=0.2)
    tasks = [p for p in mixed if p.origin.startswith("tasks:")]
    assert len(tasks) == 60
    form = re.compile(r"^(#|//) (%s): [a-z][^`:|\n]*[^.\n]\n$" % "|".join(re.escape(n) for n, _ in TASK_LANGUAGES))
    for p in tasks:
        assert not p.chat and form.match(p.text), p.text
        marker = dict(TASK_LANGUAGES)[p.text.split(": ")[0].split(" ", 1)[1]]
        assert p.text.startswith(marker + " ")
    assert len({p.text.split(":")[0] for p in tasks}) >= 4          # several languages
    rest = [p for p in mixed if p not in tasks]
    assert sorted(rest, key=repr) == sorted(build_prompts(240, seed=4), key=repr)
    bench = [json.loads(line)["text"].strip() for line in BENCH_PROMPTS.read_text().splitlines() if line.strip()]
    assert not any(b in p.text or p.text.strip() in b for p in tasks for b in bench)
    with pytest.raises(ValueError, match="sum to"):
        build_prompts(10, header_fraction=0.6, task_fraction=0.5)


def test_source_files_skip_links_into_the_repository(tmp_path):
    """A source folder's file or subfolder that is a link into the flashd repository is not read (each folder is
    resolved once, a linked file on its own)."""
    from flashd.train.data import Source, source_files
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "own.py").write_text("x = 1\n")
    (tmp_path / "pkg" / "linked.py").symlink_to(REPO_ROOT / "bench" / "bench_spec.py")
    (tmp_path / "repo_bench").symlink_to(REPO_ROOT / "bench", target_is_directory=True)
    got = source_files(Source("site", tmp_path, ".py"))
    assert got == [tmp_path / "pkg" / "own.py"]
