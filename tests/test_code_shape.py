"""The code's shape (issue 14: smaller rooms, one concept each): no Python source file of the
package, its tests or its benchmarks over 500 lines, no native source (CUDA .cu / .cuh, the C and HIP
headers) over 500 lines, and no function or method in daemon/ over 80 lines. A file or function that
grows past its limit is split along its concepts, not exempted here."""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("daemon", "protocol", "clients", "scripts", "tests", "bench", "train")
NATIVE_SOURCES = ("*.cu", "*.cuh", "*.h")   # under native/
MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 80           # in daemon/


def _sources(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def long_functions(path: Path, limit: int) -> list[tuple[str, int, int]]:
    """(qualified name, first line, line count) of every function in `path` longer than `limit`
    lines, decorators excluded, docstring and nested functions included."""
    found = []

    def visit(node, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = prefix + child.name
                if not isinstance(child, ast.ClassDef):
                    n_lines = child.end_lineno - child.lineno + 1
                    if n_lines > limit:
                        found.append((name, child.lineno, n_lines))
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(path.read_text(encoding="utf-8"), str(path)), "")
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_no_source_file_is_over_500_lines(package):
    sources = _sources(package)
    assert sources, f"no Python files under {package}/"
    too_long = {str(p.relative_to(ROOT)): n for p in sources
                if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_FILE_LINES}
    assert not too_long, f"files over {MAX_FILE_LINES} lines: {too_long}"


def test_no_native_source_is_over_500_lines():
    sources = sorted(p for pattern in NATIVE_SOURCES for p in (ROOT / "native").rglob(pattern))
    assert sources, "no native sources under native/"
    too_long = {str(p.relative_to(ROOT)): n for p in sources
                if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_FILE_LINES}
    assert not too_long, f"files over {MAX_FILE_LINES} lines: {too_long}"


def test_no_function_in_daemon_is_over_80_lines():
    too_long = [f"{p.relative_to(ROOT)}:{line} {name} ({n} lines)"
                for p in _sources("daemon") for name, line, n in long_functions(p, MAX_FUNCTION_LINES)]
    assert not too_long, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(too_long)


def test_the_function_check_measures_what_it_says(tmp_path):
    body = [f"x{i} = {i}" for i in range(80)]
    lines = ["class C:", "    @staticmethod", "    def f():", *("        " + b for b in body), "",
             "def g():", *("    " + b for b in body), "", "def h():", "    pass"]
    src = tmp_path / "m.py"
    src.write_text("\n".join(lines) + "\n")
    # the def line + 80 body lines each, the decorator not counted; g starts after C.f and a blank line
    assert long_functions(src, 80) == [("C.f", 3, 81), ("g", 85, 81)]
    assert long_functions(src, 81) == []
