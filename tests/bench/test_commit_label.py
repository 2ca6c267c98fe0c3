"""bench/out_files.py commit_label: the commit a benchmark's title names -- the short HEAD of the checkout, "+dirty"
when tracked files differ from it (a GPU host's copy of a working tree can carry git metadata older than its files:
session 32's results were all labelled with the session's first commit), "?" outside a git checkout."""
import os
import shutil
import subprocess

import pytest

from flashd.bench.out_files import commit_label

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git not installed")


def git(cwd, *args):
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout.strip()


def test_clean_dirty_and_no_checkout(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "a.txt").write_text("one\n")
    git(repo, "add", "a.txt")
    git(repo, "commit", "-q", "-m", "first")
    head = git(repo, "rev-parse", "--short", "HEAD")
    assert commit_label(repo) == head
    (repo / "b.txt").write_text("untracked files do not count\n")
    assert commit_label(repo) == head
    (repo / "a.txt").write_text("two\n")                  # the files run are not the commit named
    assert commit_label(repo) == head + "+dirty"
    outside = tmp_path / "plain"
    outside.mkdir()
    assert commit_label(outside) == "?"


@pytest.mark.parametrize("label,want", [("804b4b4", "804b4b4"), ("804b4b4+dirty", "804b4b4-dirty"), ("?", "unknown")])
def test_file_label_keeps_names_to_plain_characters(label, want):
    from flashd.bench.out_files import file_label
    assert file_label(label) == want
