"""Soak: a bounded run of the real daemon (`flashd serve`) with a mixed load, checking that it stays
correct and that its memory does not grow.

    python bench/soak.py                                  # ~3 minutes on the synthetic test model, CPU
    python bench/soak.py --minutes 30 --model M.gguf --draft-model D.gguf --device cuda --out res.json

The load, in rounds of 1-4 concurrent requests spread over stdin (line dialect) and ZeroMQ peers
(msgpack): greedy and seeded-sampled generates of different lengths, streamed or not, from short
prompts, text prompts and prompts sharing a 600-token prefix (prefix-cache hits, also from host RAM
when two prefixes alternate); greedy ones under a random spec mode (off, chain, ddtree, auto) and
drafter (the built-in ngram, the --draft-model if given, or the daemon's default), sampled ones off or
chain. Between rounds, in turn: park/unpark the drafters, park+unpark the target, park+unpark all;
every third round a long generate is cancelled after its first token.

Checks:
(a) outputs: a request's tokens are recorded the first time it runs (or, with --reference fresh, on a
    fresh daemon before the soak) and every repetition must equal them exactly. Greedy output does not
    depend on the spec mode or drafter (speculative decoding never changes it), so all greedy variants of
    a prompt share one record; a sampled one is keyed by its effective mode (chain, or off when its
    drafter was parked: it then decodes plainly). A cancelled generate's tokens must be a prefix of its
    record when there is one.
(b) every request (cancels and park/unpark included) gets exactly one terminal event, and nothing
    arrives for a request after it.
(c) memory: the daemon's VmRSS (and device memory from its `status`, on CUDA) sampled every few
    seconds; the samples after the warm-up (the first pass over every distinct request, then
    --warmup-fraction of the time: caches and allocator pools fill there) are judged. Growth (median
    of the last fifth minus median of the first fifth) above max(--rss-threshold-mib, 10% of the
    start) fails. Why that bound: a leak tied to requests -- a KV cache, a logits array or a prefix
    copy kept per request -- costs from 100 KB to many MB each, so the hundreds to thousands of requests
    of a soak grow by far more than 64 MiB; the allocator's own drift (glibc arenas, Python's pools
    settling) is a few MiB on this daemon (bench/results/2026-11-26-cpu-soak.md has the samples), so
    the bound does not fail by noise.
Exit status 1 when any check fails. --out writes the JSON result.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import zmq

from flashd.bench.soak_memory import MemorySample, judge, read_rss_mib, vram_used_mib
from flashd.bench.soak_report import as_json, report
from flashd.protocol import lines, wire

TERMINAL = ("done", "result", "error")
REPLY_TIMEOUT_S = 600.0       # the longest one round may wait for its answers (a real model on a CPU)
PREFIX_TOKENS = 600           # shared prompt prefix: more than one 512-token prefill chunk, so it is reused
ACTIONS = ("park draft", "unpark draft", "cycle target", "cycle all")   # between rounds, in turn
SAMPLING = {"temperature": 0.8, "top_k": 40, "top_p": 0.95}


@dataclass(slots=True, frozen=True)
class SoakConfig:
    model: str | None = None            # GGUF; None: a synthetic test model written to workdir
    draft_model: str | None = None      # a draft-model GGUF (loaded as --draft); None: ngram only (synthetic:
                                        # a second synthetic model)
    device: str = "cpu"
    max_ctx: int = 2048
    minutes: float = 3.0                # wall time of the soak (after the daemon is ready)
    max_requests: int | None = None     # stop after this many requests instead (tests)
    seed: int = 1
    zmq_peers: int = 2
    reference: str = "first"            # first: record on first run; fresh: from a fresh daemon first
    warmup_fraction: float = 0.2        # of the time after the first pass, not judged for memory
    rss_threshold_mib: float = 64.0     # growth bound (see the module docstring for why)
    sample_every_s: float = 2.0
    workdir: str | None = None

    def __post_init__(self):
        if self.device not in ("cpu", "cuda", "auto"):
            raise ValueError(f"device must be cpu, cuda or auto, got {self.device!r}")
        if not self.max_ctx >= 2 * PREFIX_TOKENS:
            raise ValueError(f"max_ctx must be >= {2 * PREFIX_TOKENS} (the shared prefix and a long generate)")
        if not self.minutes > 0 or (self.max_requests is not None and self.max_requests < 1):
            raise ValueError("minutes must be > 0 and max_requests >= 1")
        if self.reference not in ("first", "fresh"):
            raise ValueError(f"reference must be first or fresh, got {self.reference!r}")
        if not 0 <= self.warmup_fraction < 1 or not self.sample_every_s > 0 or not self.rss_threshold_mib > 0:
            raise ValueError("warmup_fraction in [0, 1), sample_every_s > 0, rss_threshold_mib > 0")
        if self.zmq_peers < 0:
            raise ValueError("zmq_peers must be >= 0")


# ------------------------------------------------------------------------------------ the load


@dataclass(slots=True, frozen=True)
class Entry:
    """One distinct request: a prompt, a length and (sampled) a seed. Spec mode, drafter, stream and
    transport are drawn each time it is sent."""
    name: str
    prompt: tuple                       # ("ids", (..)) or ("text", "...")
    max_tokens: int
    seed: int | None = None             # None: greedy

    def fields(self, rng: random.Random, drafts: list[str | None]) -> dict:
        out = {self.prompt[0]: list(self.prompt[1]) if self.prompt[0] == "ids" else self.prompt[1],
               "max_tokens": self.max_tokens, "ignore_eos": True, "stream": rng.random() < 0.7}
        modes = ("off", "chain") if self.seed is not None else ("off", "chain", "ddtree", "auto")
        spec = rng.choice(modes)
        if spec != "off":
            out["spec"] = spec
            draft = rng.choice(drafts)
            if draft is not None:
                out["draft"] = draft
        if self.seed is not None:
            out.update(SAMPLING, seed=self.seed)
        return out

    def key(self, fields: dict, done: dict) -> str:
        if self.seed is None:
            return self.name                # greedy: one output whatever the spec mode
        parked = bool((done.get("spec") or {}).get("parked"))
        spec = "off" if parked or fields.get("spec", "off") == "off" else fields["spec"]
        return f"{self.name}|{spec}|{fields.get('draft') if spec != 'off' else ''}"


def catalog(seed: int, vocab: int, max_ctx: int) -> tuple[list[Entry], Entry]:
    """The distinct requests and the cancel victim (a generate long enough to be cancelled mid-stream)."""
    rng = random.Random(seed)
    top = min(vocab - 3, 100_000)       # below the special tokens at the end of real vocabularies

    def ids(n: int) -> tuple:
        return ("ids", tuple(rng.randrange(top) for _ in range(n)))

    prefixes = [ids(PREFIX_TOKENS)[1] for _ in range(2)]
    entries = [Entry(f"short{i}", ids(rng.randint(5, 30)), rng.choice((8, 24, 48))) for i in range(3)]
    entries += [Entry(f"text{i}", ("text", t), rng.choice((8, 24)))
                for i, t in enumerate(("The quick brown fox", "def fib(n):", "hello world, again"))]
    entries += [Entry(f"prefix{p}-{j}", ("ids", prefixes[p] + ids(rng.randint(10, 40))[1]), rng.choice((8, 24)))
                for p in range(2) for j in range(3 - p)]
    entries += [Entry(f"sampled{i}", entries[i].prompt, 24, seed=i + 1) for i in range(2)]
    entries += [Entry("sampled-prefix", entries[6].prompt, 16, seed=9), Entry("prefill-only", ids(40), 0)]
    victim = Entry("long", ids(12), max_ctx - 32)
    return entries, victim


# ------------------------------------------------------------------------------------ the daemon


class Channel:
    """One client of the daemon: stdin/stdout (line dialect) or a ZeroMQ DEALER (msgpack)."""

    def __init__(self, name: str, proc: subprocess.Popen | None = None, sock=None):
        self.name, self.proc, self.sock, self._buf = name, proc, sock, b""

    def send(self, verb: str, fields: dict) -> None:
        if self.sock is not None:
            self.sock.send(wire.encode_request({"cmd": verb, **fields}))
        else:
            self.proc.stdin.write((lines.format_fields(verb, fields) + "\n").encode())
            self.proc.stdin.flush()

    def read(self) -> list[dict]:
        """Every event available now (non-blocking)."""
        if self.sock is not None:
            out = []
            while self.sock.poll(0):
                out.append(wire.decode_event(self.sock.recv()))
            return out
        chunk = os.read(self.proc.stdout.fileno(), 1 << 20)
        if not chunk:
            raise RuntimeError("the daemon closed its stdout")
        self._buf += chunk
        *complete, self._buf = self._buf.split(b"\n")
        return [json.loads(line) for line in complete if line.strip()]


class Daemon:
    def __init__(self, config: SoakConfig, model: str, drafts: list[str], workdir: Path, with_zmq: bool):
        argv = [sys.executable, "-m", "flashd.daemon", "--model", model, "--device", config.device, "--max-ctx",
                str(config.max_ctx), "--log-level", "warning"] + [a for d in drafts for a in ("--draft", d)]
        if with_zmq:
            argv += ["--zmq", "tcp://127.0.0.1:*"]
        self.stderr = open(workdir / f"daemon-{time.monotonic_ns()}.log", "wb")
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr)
        self.ctx = zmq.Context()
        self.channels = [Channel("stdin", proc=self.proc)]
        self.poller = zmq.Poller()
        self.poller.register(self.proc.stdout.fileno(), zmq.POLLIN)
        self.ready = self._first_event()
        for i in range(config.zmq_peers if with_zmq else 0):
            sock = self.ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(self.ready["zmq"])
            self.poller.register(sock, zmq.POLLIN)
            self.channels.append(Channel(f"zmq{i}", sock=sock))

    def _first_event(self) -> dict:
        events: list[dict] = []
        deadline = time.monotonic() + REPLY_TIMEOUT_S
        while not events:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"the daemon did not become ready; see {self.stderr.name}")
            if self.poller.poll(500):
                events = self.channels[0].read()
        if events[0].get("event") != "ready":
            raise RuntimeError(f"first event is not ready: {events[0]}")
        return events[0]

    def poll(self, timeout_s: float) -> list[tuple[Channel, dict]]:
        ready = dict(self.poller.poll(int(timeout_s * 1000)))
        out = []
        for ch in self.channels:
            key = ch.sock if ch.sock is not None else ch.proc.stdout.fileno()
            if key in ready:
                out += [(ch, event) for event in ch.read()]
        return out

    def close(self) -> None:
        try:
            self.channels[0].send("quit", {"id": "quit"})
            self.proc.stdin.close()
            self.proc.wait(30)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait(10)
        self.ctx.destroy(0)
        self.stderr.close()


# ------------------------------------------------------------------------------------ the run


@dataclass(slots=True)
class Sent:
    channel: Channel
    id: str
    verb: str
    fields: dict
    entry: Entry | None = None
    tokens: list = field(default_factory=list)
    terminal: dict | None = None


@dataclass(slots=True)
class SoakResult:
    counts: dict = field(default_factory=dict)
    mismatches: list = field(default_factory=list)      # (a)
    violations: list = field(default_factory=list)      # (b)
    unexpected_errors: list = field(default_factory=list)
    samples: list = field(default_factory=list)         # MemorySample
    memory: dict = field(default_factory=dict)          # "rss" / "vram": trend, threshold, ok
    ready: dict = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return (not self.mismatches and not self.violations and not self.unexpected_errors
                and all(m["ok"] is not False for m in self.memory.values()))


class Soak:
    def __init__(self, config: SoakConfig, daemon: Daemon, references: dict[str, list[int]]):
        self.config, self.daemon, self.refs = config, daemon, references
        self.result = SoakResult(ready=daemon.ready)
        self.live: dict[tuple[str, str], Sent] = {}
        self.finished: set[tuple[str, str]] = set()
        self.n_ids = 0
        self.counts = self.result.counts

    def count(self, *names: str) -> None:
        for name in names:
            self.counts[name] = self.counts.get(name, 0) + 1

    def send(self, channel: Channel, verb: str, fields: dict, entry: Entry | None = None) -> Sent:
        self.n_ids += 1
        sent = Sent(channel, f"s{self.n_ids}", verb, fields, entry)
        self.live[(channel.name, sent.id)] = sent
        channel.send(verb, {"id": sent.id, **fields})
        self.count(f"sent {verb}", f"via {channel.name}")
        return sent

    def wait(self, batch: list[Sent], on_token=None) -> None:
        """Read events until every request of `batch` has its terminal event."""
        deadline = time.monotonic() + REPLY_TIMEOUT_S
        while any(s.terminal is None for s in batch):
            if time.monotonic() > deadline or self.daemon.proc.poll() is not None:
                raise RuntimeError(f"no answer within {REPLY_TIMEOUT_S} s (daemon exit {self.daemon.proc.poll()}; "
                                   f"see {self.daemon.stderr.name})")
            for channel, event in self.daemon.poll(0.5):
                self.on_event(channel, event, on_token)

    def on_event(self, channel: Channel, event: dict, on_token=None) -> None:
        key = (channel.name, event.get("id"))
        sent = self.live.get(key)
        if sent is None:
            what = "after its terminal event" if key in self.finished else "for no request sent"
            self.result.violations.append(f"{channel.name}: {event.get('event')} {what}: {str(event)[:200]}")
            return
        if event["event"] == "token":
            sent.tokens += list(event["ids"])
            if on_token is not None:
                on_token(sent)
            return
        if event["event"] not in TERMINAL:
            self.result.violations.append(f"{channel.name}: unknown event {str(event)[:200]}")
            return
        sent.terminal = event
        del self.live[key]
        self.finished.add(key)
        self.count(f"answered {sent.verb}")
        if sent.entry is not None:
            self.check_output(sent)
        elif event["event"] == "error":
            self.result.unexpected_errors.append(f"{sent.verb} {sent.fields}: {event}")

    def check_output(self, sent: Sent) -> None:
        done = sent.terminal
        ids = list(done.get("ids", sent.tokens)) if done["event"] == "done" and not sent.fields["stream"] else sent.tokens
        key = sent.entry.key(sent.fields, done)
        ref = self.refs.get(key)
        if sent.entry.name == "long":                         # the cancel victim
            self.count("cancelled" if done.get("code") == "cancelled" else f"victim {done['event']}")
            if done["event"] == "error" and done.get("code") != "cancelled":
                self.result.unexpected_errors.append(f"victim: {done}")
            if ref is not None and ids != ref[:len(ids)]:
                self.result.mismatches.append({"key": key, "got": ids[:16], "want": ref[:16], "prefix": True})
            if done["event"] == "done" and ref is None:
                self.refs[key] = ids
            return
        if done["event"] != "done":
            self.result.unexpected_errors.append(f"generate {sent.entry.name}: {done}")
            return
        self.count("greedy" if sent.entry.seed is None else "sampled", f"spec {sent.fields.get('spec', 'off')}")
        if done.get("n_cached", 0) > 0:
            self.count("prefix-cache hits")
        if (done.get("spec") or {}).get("parked"):
            self.count("drafter parked: plain")
        if ref is None:
            self.refs[key] = ids
            self.count("recorded")
        elif ids != ref:
            self.result.mismatches.append({"key": key, "fields": {k: v for k, v in sent.fields.items() if k != "ids"},
                                           "got": ids[:16], "want": ref[:16], "n_got": len(ids), "n_want": len(ref)})
        else:
            self.count("compared, equal")
        self.counts["tokens generated"] = self.counts.get("tokens generated", 0) + len(ids)

    def call(self, verb: str, fields: dict) -> dict:
        sent = self.send(self.daemon.channels[-1], verb, fields)
        self.wait([sent])
        return sent.terminal

    def round(self, rng: random.Random, entries: list[Entry], drafts: list[str | None],
              victim: Entry | None) -> None:
        batch = [self.send(rng.choice(self.daemon.channels), "generate", e.fields(rng, drafts), e) for e in entries]
        if victim is not None:
            fields = {**victim.fields(rng, drafts), "stream": True}
            batch.append(self.send(rng.choice(self.daemon.channels), "generate", fields, victim))

            target = batch[-1]

            def cancel_on_first_token(sent: Sent) -> None:
                if sent is target and batch[-1] is target:    # once: the cancel joins the batch
                    batch.append(self.send(sent.channel, "cancel", {"target": sent.id}))
            self.wait(batch, cancel_on_first_token)
        else:
            self.wait(batch)

    def action(self, name: str) -> None:
        self.count(name)
        if name in ("park draft", "unpark draft"):
            self.call(name.split()[0], {"what": "draft"})
        else:
            what = name.split()[1]
            self.call("park", {"what": what})
            self.call("unpark", {"what": what})

    def sample(self, t0: float, measured: bool) -> None:
        vram = None
        if self.daemon.ready.get("backend") == "cuda":
            vram = vram_used_mib(self.call("status", {}))
        self.result.samples.append(MemorySample(time.monotonic() - t0, self.counts.get("answered generate", 0),
                                                read_rss_mib(self.daemon.proc.pid), vram, measured))


def _drafts(config: SoakConfig, workdir: Path, synthetic: bool) -> tuple[str, list[str]]:
    """(target path, --draft values): the synthetic pair when no --model."""
    if not synthetic:
        return config.model, ["ngram"] + ([config.draft_model] if config.draft_model else [])
    from flashd.scripts.make_synthetic_gguf import SyntheticSpec, write_synthetic_model
    spec = dict(arch="qwen2", n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, ffn=128, vocab_size=512,
                weight_type="Q8_0", name="soak")
    target = write_synthetic_model(workdir / "soak-target.gguf", SyntheticSpec(seed=20240611, **spec))
    draft = config.draft_model or str(write_synthetic_model(workdir / "soak-draft.gguf", SyntheticSpec(seed=5, **spec)))
    return str(target), ["ngram", draft]


def run_soak(config: SoakConfig) -> SoakResult:
    workdir = Path(config.workdir or tempfile.mkdtemp(prefix="flashd-soak-"))
    model, drafts = _drafts(config, workdir, config.model is None)
    names: list[str | None] = [None, "ngram"] + drafts[1:]
    references: dict[str, list[int]] = {}
    if config.reference == "fresh":
        fresh = Daemon(config, model, drafts, workdir, with_zmq=False)
        try:
            entries, _ = catalog(config.seed, fresh.ready["vocab_size"], config.max_ctx)
            recorder = Soak(config, fresh, references)
            for entry in entries:                             # one at a time, spec off: the plain outputs
                fields = entry.fields(random.Random(0), [None])
                fields.pop("spec", None)
                recorder.wait([recorder.send(fresh.channels[0], "generate", fields, entry)])
            if recorder.result.unexpected_errors:
                raise RuntimeError(f"the fresh reference run failed: {recorder.result.unexpected_errors[:3]}")
        finally:
            fresh.close()
    daemon = Daemon(config, model, drafts, workdir, with_zmq=True)
    soak = Soak(config, daemon, references)
    rng = random.Random(config.seed)
    entries, victim = catalog(config.seed, daemon.ready["vocab_size"], config.max_ctx)
    t0 = time.monotonic()
    end = t0 + config.minutes * 60
    try:
        first_pass = list(entries)
        warm_until = None
        n_round = next_sample = 0
        while True:
            n_done = soak.counts.get("answered generate", 0)
            if time.monotonic() >= end or (config.max_requests is not None and n_done >= config.max_requests):
                break
            if first_pass:
                batch, first_pass = first_pass[:4], first_pass[4:]
                soak.round(rng, batch, names, None)
            else:
                if warm_until is None:
                    warm_until = time.monotonic() + config.warmup_fraction * max(0.0, end - time.monotonic())
                n_round += 1
                soak.round(rng, [rng.choice(entries) for _ in range(rng.randint(1, 4))], names,
                           victim if n_round % 3 == 0 else None)
                soak.action(ACTIONS[n_round % len(ACTIONS)])
            if time.monotonic() >= next_sample:
                soak.sample(t0, measured=warm_until is not None and time.monotonic() >= warm_until)
                next_sample = time.monotonic() + config.sample_every_s
        soak.wait(list(soak.live.values()))
        soak.call("status", {})                               # a last exchange: stray events show up here
        time.sleep(0.2)
        for channel, event in daemon.poll(0.2):
            soak.on_event(channel, event)
        soak.sample(t0, measured=warm_until is not None and time.monotonic() >= warm_until)
    finally:
        daemon.close()
    soak.result.seconds = time.monotonic() - t0
    soak.result.memory = judge(soak.result.samples, config.rss_threshold_mib)
    return soak.result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="target GGUF (default: a synthetic test model)")
    p.add_argument("--draft-model", help="draft-model GGUF, loaded with --draft next to ngram")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda", "auto"))
    p.add_argument("--max-ctx", type=int, default=2048)
    p.add_argument("--minutes", type=float, default=3.0)
    p.add_argument("--max-requests", type=int)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--zmq-peers", type=int, default=2)
    p.add_argument("--reference", choices=("first", "fresh"), default="first")
    p.add_argument("--warmup-fraction", type=float, default=0.2)
    p.add_argument("--rss-threshold-mib", type=float, default=64.0)
    p.add_argument("--sample-every", type=float, default=2.0, help="seconds between memory samples")
    p.add_argument("--out", type=Path, help="write the JSON result here")
    a = p.parse_args()
    config = SoakConfig(model=a.model, draft_model=a.draft_model, device=a.device, max_ctx=a.max_ctx,
                        minutes=a.minutes, max_requests=a.max_requests, seed=a.seed, zmq_peers=a.zmq_peers,
                        reference=a.reference, warmup_fraction=a.warmup_fraction,
                        rss_threshold_mib=a.rss_threshold_mib, sample_every_s=a.sample_every)
    result = run_soak(config)
    print(report(config, result))
    for problem in (result.mismatches + result.violations + result.unexpected_errors)[:20]:
        print("  ", problem)
    if a.out is not None:
        a.out.write_text(json.dumps(as_json(config, result), indent=1) + "\n")
        print(f"wrote {a.out}")
    return 0 if result.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
