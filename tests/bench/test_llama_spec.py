"""bench/llama_spec.py (llama.cpp's rows of bench_spec.py) without llama.cpp: the command lines it builds
for llama-simple and llama-speculative-simple, the parsing of what those tools print, and a failing tool
becoming a failed row. The flags and output formats are those of the llama.cpp vendored in
llama-cpp-python 0.3.36 (vendor/llama.cpp); each test names the source file it copies from."""
import math
import stat
import sys

import pytest

from flashd.bench import llama_spec as ls

# Every flag llama-speculative-simple accepts that these command lines may use, with the registering
# call's examples in common/arg.cpp: -m -p -n -ngl -fa -c --temp --spec-type are common to all tools;
# the -md/-ngld/--spec-draft-*/--spec-ngram-* flags are registered with LLAMA_EXAMPLE_SPECULATIVE (an
# option without it makes common_params_parse fail with "error: invalid argument: ...").
ACCEPTED = {"-m", "-p", "-n", "-ngl", "-fa", "-c", "--temp", "--spec-type", "-md", "-ngld", "--spec-draft-n-max",
            "--spec-ngram-simple-size-m", "--spec-ngram-map-k-size-m", "--spec-ngram-map-k4v-size-m",
            "--spec-ngram-mod-n-max", "--spec-ngram-mod-n-min"}
# removed in this version (common/arg.cpp "removed params": arg_removed throws "the argument has been removed")
REMOVED = {"--draft", "--draft-n", "--draft-max", "--draft-min", "--draft-n-min", "--spec-ngram-size-n",
           "--spec-ngram-size-m", "--spec-ngram-min-hits"}


def flags(cmd):
    return [a for a in cmd[1:] if a.startswith("-") and not a.lstrip("-").isdigit()]


def value(cmd, flag):
    return cmd[cmd.index(flag) + 1]


def test_every_speculative_row_names_a_type_this_llama_cpp_knows(tmp_path):
    """Without --spec-type the types stay {none} (common/common.h) and llama-speculative-simple exits with
    'failed to initialize speculative decoding': every speculative row passes one of speculative.cpp's names."""
    draft = tmp_path / "draft.gguf"
    runs = ls.llama_runs(draft, 16, ls.NGRAM_TYPES)
    assert [r.spec_type for r in runs] == [None, "draft-simple", *ls.NGRAM_TYPES]
    for run in runs:
        cmd = ls.llama_cmd(tmp_path, run, tmp_path / "t.gguf", "def f():", 32)
        assert cmd[0] == str(tmp_path / run.tool)
        if run.tool == "llama-simple":       # its own parser: -m, -n, -ngl, then the prompt
            assert cmd[1:] == ["-m", str(tmp_path / "t.gguf"), "-n", "32", "-ngl", "99", "def f():"]
            continue
        assert value(cmd, "--spec-type") == run.spec_type and run.spec_type in ls.SPEC_TYPES
        assert value(cmd, "-p") == "def f():" and value(cmd, "--temp") == "0"
        assert set(flags(cmd)) <= ACCEPTED and not set(flags(cmd)) & REMOVED
        assert len(flags(cmd)) == len(set(flags(cmd)))   # a repeated option draws a DEPRECATED warning


def test_each_type_caps_its_draft_with_its_own_flag(tmp_path):
    """common_speculative_n_max: draft-* types read --spec-draft-n-max, ngram-simple/map-k/map-k4v their
    m-gram size, ngram-mod its n-max (and drops drafts under n-min), ngram-cache a fixed 8."""
    draft = tmp_path / "draft.gguf"
    cmds = {r.spec_type: ls.llama_cmd(tmp_path, r, tmp_path / "t.gguf", "x", 8)
            for r in ls.llama_runs(draft, 12, ls.NGRAM_TYPES)}
    assert value(cmds["draft-simple"], "-md") == str(draft)
    assert value(cmds["draft-simple"], "--spec-draft-n-max") == "12"
    for t in ("ngram-simple", "ngram-map-k", "ngram-map-k4v"):
        assert value(cmds[t], f"--spec-{t}-size-m") == "12"
    assert value(cmds["ngram-mod"], "--spec-ngram-mod-n-max") == "12"
    assert value(cmds["ngram-mod"], "--spec-ngram-mod-n-min") == "9"      # llama.cpp's default 48/64 of it
    assert flags(cmds["ngram-cache"])[-1] == "--spec-type"               # nothing to set
    for t in ls.NGRAM_TYPES:          # n-gram types draft from the context: no draft model, no draft length
        assert "-md" not in cmds[t] and "--spec-draft-n-max" not in cmds[t]


def dflash_file(path, block_size):
    """A GGUF holding only the key the DFlash row reads (dflash.block_size, when given)."""
    from flashd.scripts.gguf_out import new_gguf

    with new_gguf(path, "dflash") as w:
        if block_size is not None:
            w.add_uint32("dflash.block_size", block_size)
    return path


def test_rows_follow_the_arguments(tmp_path):
    assert [r.mode for r in ls.llama_runs(None, 16)] == ["plain"] + ["ngram"] * len(ls.DEFAULT_NGRAM_TYPES)
    assert [r.spec_type for r in ls.llama_runs(None, 16, ())] == [None]
    dfl = dflash_file(tmp_path / "dfl.gguf", block_size=8)
    runs = ls.llama_runs(tmp_path / "d.gguf", 5, ("ngram-simple",), dflash=dfl)
    # the DFlash row drafts its whole trained block (block_size - 1), whatever the other rows' cap
    assert [(r.drafter, r.spec_type, r.budget) for r in runs] == [
        ("-", None, "-"), ("d", "draft-simple", "max 5"), ("dfl", "draft-dflash", "block 8: max 7"),
        ("ngram-simple", "ngram-simple", "max 5")]
    cmd = ls.llama_cmd(tmp_path, runs[2], tmp_path / "t.gguf", "x", 8)
    assert value(cmd, "-md") == str(dfl) and value(cmd, "--spec-draft-n-max") == "7"
    # common/speculative.cpp: block_size = 16 unless dflash.block_size says otherwise
    assert ls.dflash_n_max(dflash_file(tmp_path / "none.gguf", block_size=None)) == 15
    for bad in (("draft-simple",), ("ngram",), ("ngram-simple", "ngram-lookup")):
        with pytest.raises(ValueError, match="n-gram speculative types"):
            ls.llama_runs(None, 16, bad)


# ------------------------------------------------------------------------------------------ output
# examples/speculative-simple/speculative-simple.cpp, its closing LOG_INF calls (stderr, common/log.cpp)
SPEC_FORMATS = ("encoded %4d tokens in %8.3f seconds, speed: %8.3f t/s\n",
                "decoded %4d tokens in %8.3f seconds, speed: %8.3f t/s\n", "\n", "n_draft   = %d\n",
                "n_predict = %d\n", "n_drafted = %d\n", "n_accept  = %d\n", "accept    = %.3f%%\n")


def spec_stderr(n_in, t_enc, n_out, t_dec, n_draft, n_drafted, n_accept):
    vals = [(n_in, t_enc, n_in / t_enc), (n_out, t_dec, n_out / t_dec), (), (n_draft,), (n_out,), (n_drafted,),
            (n_accept,), (100.0 * n_accept / n_drafted if n_drafted else float("nan"),)]
    lines = [fmt % v for fmt, v in zip(SPEC_FORMATS, vals)]
    # model-load chatter before, the per-type statistics and perf summary after, as the tool prints them
    return ("llama_model_loader: loaded meta data with 27 key-value pairs\n" + "".join(lines) +
            "\ndraft:\n\n\ntarget:\n\ncommon_perf_print:        load time =      12.34 ms\n")


def test_parse_speculative_simple_output():
    out = ls.parse_llama_output(spec_stderr(23, 0.051, 257, 1.234, 16, 180, 120))
    assert (out.n_tokens, out.seconds, out.n_drafted, out.n_accept) == (257, 1.234, 180, 120)
    # "n_draft   = 16" (the configured cap) is not n_drafted; the encode line is not the decode line
    out = ls.parse_llama_output(spec_stderr(5, 0.002, 9, 0.5, 3, 0, 0))
    assert (out.n_tokens, out.seconds, out.n_drafted, out.n_accept) == (9, 0.5, 0, 0)


def test_parse_llama_simple_output():
    # examples/simple/simple.cpp: fprintf(stderr, "%s: decoded %d tokens in %.2f s, speed: %.2f t/s\n", __func__, ...)
    err = "main: decoded %d tokens in %.2f s, speed: %.2f t/s\n\n" % (31, 0.25, 124.0)
    out = ls.parse_llama_output("llama_model_load: ...\n" + err + "llama_perf_sampler_print: ...\n")
    assert (out.n_tokens, out.seconds, out.n_drafted, out.n_accept) == (31, 0.25, None, None)
    assert ls.parse_llama_output("main: error: unable to load model\n") is None


# Captured from this llama.cpp built for the CPU from the sdist (GGML_CUDA off), synthetic qwen2 target and
# draft: `llama-speculative-simple ... --spec-type draft-simple -md draft.gguf --spec-draft-n-max 4` and
# `llama-simple -m target.gguf -n 16 -ngl 99 "def fib(n):"` (their stderr, trimmed). The log prefix
# ("0.00.039.917 I ") is common/log.cpp's timestamp and level.
REAL_SPEC_STDERR = """\
warning: no usable GPU found, --gpu-layers option will be ignored
0.00.014.745 I cmn          init: llama threadpool init, n_threads = 2
0.00.015.959 I common_speculative_init_result: loading draft model '/tmp/s18b-models/draft.gguf'
0.00.039.908 I encoded    8 tokens in    0.001 seconds, speed: 8255.934 t/s
0.00.039.917 I decoded   33 tokens in    0.019 seconds, speed: 1774.480 t/s
0.00.039.917 I 
0.00.039.917 I n_draft   = 4
0.00.039.917 I n_predict = 33
0.00.039.918 I n_drafted = 126
0.00.039.918 I n_accept  = 0
0.00.039.918 I accept    = 0.000%
0.00.039.918 I 
0.00.039.918 I draft:

0.00.039.968 I target:

0.00.039.981 I common_perf_print: prompt eval time =      12.12 ms /   168 tokens (    0.07 ms per token, 13860.24 tokens per second)
0.00.039.992 I common_perf_print:        eval time =       0.00 ms /     1 runs   (    0.00 ms per token,      inf tokens per second)
"""
REAL_SIMPLE_STDERR = "create_tensor: loading tensor blk.1.attn_qkv.weight\nmain: decoded 16 tokens in 0.04 s, speed: 431.21 t/s\n"


def test_parse_output_captured_from_this_llama_cpp():
    out = ls.parse_llama_output(REAL_SPEC_STDERR)
    assert (out.n_tokens, out.seconds, out.n_drafted, out.n_accept) == (33, 0.019, 126, 0)
    out = ls.parse_llama_output(REAL_SIMPLE_STDERR)
    assert (out.n_tokens, out.seconds, out.n_drafted, out.n_accept) == (16, 0.04, None, None)
    # the closing lines can be lost (common/log.cpp's unflushed logger): no "decoded", no result
    assert ls.parse_llama_output(REAL_SPEC_STDERR.split("0.00.039.908")[0]) is None


@pytest.mark.parametrize("stderr, reason", [
    # speculative-simple.cpp: LOG_ERR("%s", "failed to initialize speculative decoding\n")
    ("load_tensors: ...\nfailed to initialize speculative decoding\n", "failed to initialize speculative decoding"),
    # common/arg.cpp: a removed option, wrapped with its usage (which says nothing of the failure)
    ('error while handling argument "--draft-max": the argument has been removed. use --spec-draft-n-max or '
     '--spec-ngram-mod-n-max\n\nusage:\n--draft, --draft-n, --draft-max N\tthe argument has been removed.\n\n'
     'to show complete usage, run with -h\n',
     'error while handling argument "--draft-max": the argument has been removed'),
    # the CPU build given flashd's DFlash GGUF (--spec-type draft-dflash -md dflash.gguf), its whole stderr
    # less the GPU warnings: the first error line is the cause, the "failed to initialize speculative
    # decoding" line that should follow was lost at exit
    ("0.00.007.982 E llama_model_load: error loading model: error loading model hyperparameters: key "
     "dflash.rope.freq_base has wrong type f64 but expected type f32\n"
     "0.00.008.002 E llama_model_load_from_file_impl: failed to load model\n"
     "0.00.008.042 W operator(): failed to measure the memory of the extra model, fitting without it: failed "
     "to load model\n0.00.014.967 I cmn          init: llama threadpool init, n_threads = 2\n",
     "key dflash.rope.freq_base has wrong type f64 but expected type f32"),
    ("", "exit 1"),
])
def test_failure_text_keeps_the_tools_words(stderr, reason):
    text = ls.failure_text("llama-speculative-simple", 1, stderr)
    assert text.startswith("llama-speculative-simple failed (exit 1): ") and reason in text


# --------------------------------------------------------------------------------- run_llama
def fake_tool(path, body):
    path.write_text(f"#!{sys.executable}\nimport sys\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def test_run_llama_sums_the_prompts_and_a_failing_tool_is_a_failed_row(tmp_path):
    """Two prompts through fake tools that print what llama.cpp prints: totals are summed per row; the
    speculative tool fails for ngram-mod (as this version does for a type it cannot set up) and that row
    carries the message and no speed, while the other rows still run."""
    fake_tool(tmp_path / "llama-simple", "sys.stderr.write('main: decoded 10 tokens in 0.50 s, speed: 20.00 t/s\\n')")
    stderr = spec_stderr(4, 0.01, 20, 0.25, 8, 16, 12)
    fake_tool(tmp_path / "llama-speculative-simple",
              "if 'ngram-mod' in sys.argv:\n"
              "    sys.stderr.write('failed to initialize speculative decoding\\n'); sys.exit(1)\n"
              f"sys.stderr.write({stderr!r})")
    runs = ls.llama_runs(tmp_path / "d.gguf", 8, ("ngram-simple", "ngram-mod"))
    logged = []
    res = ls.run_llama(tmp_path, runs, tmp_path / "t.gguf", ["a", "b"], 16, log=logged.append)
    plain, chain, simple, mod = res
    assert (plain.n_tokens, plain.tok_s, plain.accept_rate, plain.failed) == (20, 20.0, None, None)
    assert (chain.n_tokens, chain.tok_s, chain.n_drafted, chain.n_accept) == (40, 80.0, 32, 24)
    assert chain.accept_rate == 0.75 and simple.failed is None
    assert math.isnan(mod.tok_s) and mod.n_tokens == 0
    assert mod.failed == "llama-speculative-simple failed (exit 1): failed to initialize speculative decoding"
    assert any("--spec-type ngram-mod" in line for line in logged)


def test_run_llama_runs_again_when_the_decoded_line_was_lost(tmp_path):
    """A run that exits 0 but lost its closing log lines is run again; counts missing from a run (lines lost
    after "decoded") leave the acceptance totals to the runs that printed both."""
    calls = tmp_path / "calls"
    full = spec_stderr(4, 0.01, 20, 0.25, 8, 16, 12)
    fake_tool(tmp_path / "llama-speculative-simple",
              f"import pathlib\np = pathlib.Path({str(calls)!r})\nn = int(p.read_text()) if p.exists() else 0\n"
              "p.write_text(str(n + 1))\n"
              f"full = {full!r}\n"
              "sys.stderr.write('' if n <= 0 else full.split('n_drafted')[0] if n == 1 else full)")
    runs = ls.llama_runs(None, 8, ("ngram-simple",))[1:]
    logged = []
    [res] = ls.run_llama(tmp_path, runs, tmp_path / "t.gguf", ["a", "b"], 16, log=logged.append)
    assert calls.read_text() == "3" and any("running it again" in line for line in logged)
    assert (res.failed, res.n_tokens, res.tok_s) == (None, 40, 80.0)
    assert (res.n_drafted, res.n_accept, res.n_counted, res.accept_rate) == (16, 12, 1, 0.75)
    calls.write_text("-99")          # (n <= 0: no output) never a "decoded" line: the row fails after the retries
    [res] = ls.run_llama(tmp_path, runs, tmp_path / "t.gguf", ["a"], 16, log=logged.append)
    assert res.failed == "llama-speculative-simple failed (exit 0): exit 0" and calls.read_text() == "-96"


def test_bench_spec_table_shows_a_failed_llama_row_without_a_number(tmp_path):
    from flashd.bench.bench_spec import Row, llama_rows, table

    runs = ls.llama_runs(None, 8, ("ngram-simple",))
    results = [ls.LlamaResult(runs[0], tok_s=50.0, n_tokens=100),
               ls.LlamaResult(runs[1], failed="llama-speculative-simple failed (exit 1): failed to initialize")]
    rows = [Row("flashd", "-", "plain", "-", 60.0)] + llama_rows(results)
    assert rows[2].extra["spec_type"] == "ngram-simple" and "accept_rate" not in rows[2].extra
    lines = table(rows, "t").splitlines()
    assert lines[-2].startswith("| llama.cpp | - | plain | - | 50.0 | 1.00x |")
    assert "| failed |  |" in lines[-1] and lines[-1].endswith("failed to initialize |") and "nan" not in lines[-1]


def test_flashd_dflash_gguf_lacks_what_llama_cpps_dflash_loader_requires(tmp_path):
    """Why bench_spec's llama.cpp draft-dflash row runs an export of --dflash, not the file itself
    (llama_spec.py's docstring): llama.cpp's src/models/dflash.cpp requires the key dflash.target_layers
    (load_arch_hparams throws without it) and the tensors fc.weight and enc.output_norm.weight (create_tensor
    flag 0), and its vocab comes from the draft GGUF (tokenizer.ggml.*, the mask token
    tokenizer.ggml.mask_token_id). flashd's DFlash GGUF, as the converter and the synthetic maker write it
    (the same write_metadata and tensor names), has none of these; scripts/export_dflash_llama_cpp.py
    writes them (tests/scripts/test_export_dflash_llama_cpp.py). If flashd's own layout changes, this
    test says to revisit the export."""
    import gguf

    from flashd.scripts.convert_dflash import gguf_name
    from flashd.scripts.make_synthetic_dflash import spec_for_target, write_synthetic_dflash

    path = write_synthetic_dflash(tmp_path / "dfl.gguf", spec_for_target(256, 2, 512, n_layers=1, head_dim=64))
    r = gguf.GGUFReader(path)
    assert r.fields["general.architecture"].contents() == "dflash"      # the same arch name as llama.cpp's
    names = {t.name for t in r.tensors}
    assert not {"fc.weight", "enc.output_norm.weight"} & names
    assert {"dflash.fc.weight", "dflash.hidden_norm.weight"} <= names
    assert "dflash.target_layers" not in r.fields and "dflash.target_layer_ids" in r.fields
    assert not [k for k in r.fields if k.startswith("tokenizer.")]
    assert (gguf_name("model.fc.weight"), gguf_name("model.hidden_norm.weight")) == ("dflash.fc.weight",
                                                                                   "dflash.hidden_norm.weight")


def test_export_dflash_gives_a_file_or_the_reason(tmp_path, synthetic_model):
    """bench_spec's default draft-dflash row: --dflash exported for the target, or a failed row saying why
    (a qwen2 target: src/models/qwen2.cpp records no layer inputs, llama.cpp would abort)."""
    from flashd.scripts.make_synthetic_dflash import spec_for_target, write_synthetic_dflash

    shape = dict(n_layers=4, hidden=64, n_heads=4, n_kv_heads=2, ffn=128, vocab_size=512, weight_type="F32")
    dfl = write_synthetic_dflash(tmp_path / "dfl.gguf", spec_for_target(64, 4, 512, n_layers=1, head_dim=16,
                                                                       block_size=8))
    path, why = ls.export_dflash(dfl, synthetic_model(arch="qwen3", **shape), tmp_path / "out")
    assert why is None and path == tmp_path / "out" / "dfl-llama-cpp.gguf" and ls.dflash_n_max(path) == 7
    path, why = ls.export_dflash(dfl, synthetic_model(arch="qwen2", **shape), tmp_path / "out2")
    assert path is None and why.startswith("not run: ") and "layer input" in why
