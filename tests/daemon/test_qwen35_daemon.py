"""A qwen35 (hybrid) model served by the daemon on the CPU backend: greedy generation through `flashd serve`
equals the reference forward run one token at a time in this process (prompt fed token by token: the
recurrent form of the delta rule only), for two prompts in turn and the first again (each request starts a
new sequence: no state leaks from the one before; these prompts are shorter than a prefill chunk, so no prefix
is kept). A conversation whose turns extend each other keeps the last prompt's whole chunks with their recurrent
state, across a park/unpark of the target too, and gives a --no-prefix-cache daemon's tokens."""
import dataclasses
import random

import numpy as np

from flashd.daemon.backends.reference import ReferenceOps
from flashd.daemon.models import load_model
from flashd.daemon.runner import ModelRunner
from flashd.scripts.make_synthetic_gguf import write_synthetic_model
from flashd.scripts.synthetic_spec import SyntheticSpec
from tests.daemon.daemon_harness import generated, write_ids

SPEC = SyntheticSpec(arch="qwen35", n_layers=4, hidden=64, n_heads=2, n_kv_heads=1, head_dim=32, rope_dim=16,
                     ffn=128, ssm_state=16, ssm_k_heads=1, ssm_v_heads=2, full_attn_interval=2, weight_type="Q8_0",
                     seed=1535, name="daemon-qwen35")
N_GEN = 20


def token_by_token(runner: ModelRunner, prompt: list[int], n: int) -> list[int]:
    runner.reset()
    for t in prompt:
        logits = runner.prefill([t])[0]
    out = []
    for _ in range(n):
        out.append(int(np.argmax(logits)))
        logits = runner.prefill([out[-1]])[0]
    return out


def test_daemon_greedy_equals_the_reference_token_by_token(spawn_serve, tmp_path):
    model = write_synthetic_model(tmp_path / "q35.gguf", SPEC)
    daemon = spawn_serve(model=model)
    assert daemon.ready["arch"] == "qwen35"
    ops = ReferenceOps()
    lm = load_model(model, ops.load_weight)
    runner = ModelRunner(ops, lm.config, lm.weights, 512, 512)
    for i, text in enumerate(["Once upon a time", "def fib(n):", "Once upon a time"]):
        prompt = daemon.ask(f'tokenize id=t{i} text="{text}"', f"t{i}")[-1]["ids"]
        ids, _, done = generated(daemon.ask(f'generate id=g{i} text="{text}" max_tokens={N_GEN} ignore_eos=true',
                                            f"g{i}"))
        assert done["event"] == "done" and done.get("n_cached", 0) == 0
        assert ids == token_by_token(runner, prompt, N_GEN), text


def test_speculative_requests_on_a_hybrid_are_exact(spawn_serve, tmp_path):
    """Drafts are verified with a recurrent state per tree node (models/qwen35_tree.py): speculative requests with
    the n-gram drafter and with a 2-layer hybrid draft model (`--draft`), chain and tree, give plain decoding's
    tokens, and their done.spec counts drafting steps."""
    model = write_synthetic_model(tmp_path / "q35.gguf", SPEC)
    draft = write_synthetic_model(tmp_path / "q35-draft.gguf",
                                  dataclasses.replace(SPEC, n_layers=2, name="daemon-qwen35-draft"))
    daemon = spawn_serve("--draft", str(draft), "--draft", "ngram", model=model)
    text = "ab ab ab ab ab ab"
    plain, _, _ = generated(daemon.ask(f'generate id=p text="{text}" max_tokens={N_GEN} ignore_eos=true', "p"))
    accepted = 0
    for i, how in enumerate(("spec=chain draft=ngram", "spec=ddtree draft=q35-draft", "spec=chain draft=q35-draft")):
        ids, _, done = generated(daemon.ask(f'generate id=s{i} text="{text}" max_tokens={N_GEN} ignore_eos=true '
                                            f"{how}", f"s{i}"))
        assert ids == plain, how
        assert done["spec"]["steps"] > 0 and "unsupported" not in done["spec"], done["spec"]
        accepted += done["spec"]["accepted"]
    assert accepted > 0


def test_turns_keep_the_prefix_and_its_state_across_park(spawn_serve, tmp_path):
    """Three turns (each prompt = the last one + its answer + a new message; the daemon's prefill chunk is 512),
    the target parked and unparked before the third: turns 2 and 3 keep 512 tokens (the third from the host
    copy that parking made: the unparked cache is empty), and every output equals a --no-prefix-cache daemon's."""
    model = write_synthetic_model(tmp_path / "q35.gguf", SPEC)
    rng = random.Random(15)
    new = [[rng.randrange(SPEC.vocab_size) for _ in range(n)] for n in (600, 40, 30)]
    outputs = {}
    for flag in ("--prefix-cache", "--no-prefix-cache"):
        daemon = spawn_serve(flag, max_ctx=800, model=model)
        prompt, runs = [], []
        for turn in range(3):
            prompt = prompt + (runs[-1][0] if runs else []) + new[turn]
            if turn == 2:
                assert daemon.ask("status id=st", "st")[-1]["prefix_cache"]["tokens"] == (
                    512 if flag == "--prefix-cache" else 0)
                for verb in ("park", "unpark"):
                    assert daemon.ask(f"{verb} id={verb} what=target", verb)[-1]["event"] == "result"
            f = write_ids(tmp_path / f"{flag}-{turn}.bin", prompt)
            runs.append(generated(daemon.ask(f"generate id=g{turn} ids=@{f} max_tokens=8 ignore_eos=true",
                                             f"g{turn}")))
        outputs[flag] = [ids for ids, _, _ in runs]
        want = [0, 512, 512] if flag == "--prefix-cache" else [0, 0, 0]
        assert [done.get("n_cached", 0) for _, _, done in runs] == want
    assert outputs["--prefix-cache"] == outputs["--no-prefix-cache"]
