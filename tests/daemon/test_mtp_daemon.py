"""`flashd serve --draft mtp`: a qwen35 target's own multi-token-prediction block as a drafter, through the real
daemon process on the CPU backend. Speculative requests with draft=mtp (chain, ddtree, auto) give plain decoding's
tokens; status lists the drafter; parking and unparking the target reloads it (it runs on the target's weights and
file); `park what=draft` releases it and `unpark what=draft` loads it again, the output unchanged. A target
without nextn layers refuses `--draft mtp` at start with the reason."""
import dataclasses
import subprocess
import sys

from flashd.scripts.make_synthetic_gguf import write_synthetic_model
from flashd.scripts.synthetic_spec import SyntheticSpec
from tests.daemon.daemon_harness import READ_TIMEOUT_S, generated

SPEC = SyntheticSpec(arch="qwen35", n_layers=4, hidden=64, n_heads=2, n_kv_heads=1, head_dim=32, rope_dim=16,
                     ffn=128, ssm_state=16, ssm_k_heads=1, ssm_v_heads=2, full_attn_interval=2, weight_type="Q8_0",
                     seed=1536, mtp=True, name="daemon-qwen35-mtp")
GEN = 'generate id={id} text="ab ab ab ab ab ab" max_tokens=20 ignore_eos=true'


def run(daemon, extra: str, request_id: str):
    ids, _, done = generated(daemon.ask(GEN.format(id=request_id) + extra, request_id))
    assert done["event"] == "done", done
    return ids, done


def test_mtp_drafter_through_the_daemon(spawn_serve, tmp_path):
    model = write_synthetic_model(tmp_path / "q35-mtp.gguf", SPEC)
    daemon = spawn_serve("--draft", "mtp", model=model)
    status = daemon.ask("status id=st", "st")[-1]
    assert [(d["name"], d["kind"]) for d in status["drafters"]] == [("mtp", "MTPDrafter")]
    want, _ = run(daemon, "", "plain")
    for i, how in enumerate((" spec=chain draft=mtp", " spec=ddtree budget=8 draft=mtp", " spec=auto",
                             " spec=chain budget=2")):
        ids, done = run(daemon, how, f"s{i}")
        assert ids == want, how
        assert done["spec"]["draft"] == "mtp" and done["spec"]["steps"] > 0, done["spec"]
    for verb in ("park", "unpark"):
        assert daemon.ask(f"{verb} id={verb} what=target", verb)[-1]["event"] == "result"
    ids, done = run(daemon, " spec=chain draft=mtp", "after-target")
    assert ids == want and done["spec"]["steps"] > 0
    parked = daemon.ask("park id=pd what=draft", "pd")[-1]
    assert parked["event"] == "result" and parked["parked"]["spec_drafters"] == ["mtp"]
    ids, done = run(daemon, " spec=chain draft=mtp", "while-parked")
    assert ids == want and done["spec"]["parked"] is True
    assert daemon.ask("unpark id=ud what=draft", "ud")[-1]["event"] == "result"
    ids, done = run(daemon, " spec=chain draft=mtp", "after-draft")
    assert ids == want and done["spec"]["steps"] > 0 and "parked" not in done["spec"]


def test_draft_mtp_needs_the_start_option(spawn_serve, tmp_path):
    daemon = spawn_serve(model=write_synthetic_model(tmp_path / "q35-mtp.gguf", SPEC))
    err = daemon.ask(GEN.format(id="x") + " spec=chain draft=mtp", "x")[-1]
    assert err["event"] == "error" and err["code"] == "not_loaded" and "--draft mtp" in err["message"]


def test_a_target_without_mtp_layers_refuses_draft_mtp(tmp_path):
    model = write_synthetic_model(tmp_path / "plain.gguf", dataclasses.replace(SPEC, mtp=False))
    result = subprocess.run([sys.executable, "-m", "flashd.daemon", "--model", str(model), "--device", "cpu",
                             "--draft", "mtp"], stdin=subprocess.DEVNULL, capture_output=True, timeout=READ_TIMEOUT_S)
    assert result.returncode == 1 and result.stdout == b""
    assert b"multi-token-prediction" in result.stderr and b"nextn" in result.stderr
