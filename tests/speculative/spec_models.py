"""The tiny synthetic target and draft model shapes of the spec tests (imported by name: a
`from conftest import` picks up whichever conftest pytest loaded first)."""

# A small vocabulary (the minimum is 256 bytes + 3 specials) keeps the reference forward cheap and
# makes drafts from a different-seed model agree with the target now and then.
TARGET = dict(arch="qwen2", n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, ffn=128, vocab_size=320,
              seed=1, name="spec-target")
DRAFT = dict(TARGET, n_layers=1, seed=1, name="spec-draft")   # same seed: shares the embeddings
OTHER_VOCAB = dict(DRAFT, vocab_size=384, name="spec-other-vocab")
