"""The tiny synthetic target and draft model shapes of the spec tests (imported by name: a
`from conftest import` picks up whichever conftest pytest loaded first)."""

# A small vocabulary (the minimum is 256 bytes + 3 specials) keeps the reference forward cheap and
# makes drafts from a different-seed model agree with the target now and then.
TARGET = dict(arch="qwen2", n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, ffn=128, vocab_size=320,
              seed=1, name="spec-target")
DRAFT = dict(TARGET, n_layers=1, seed=1, name="spec-draft")   # same seed: shares the embeddings
OTHER_VOCAB = dict(DRAFT, vocab_size=384, name="spec-other-vocab")

# A hybrid (qwen35) target with the same vocabulary: Gated DeltaNet layers 0 and 2, gated attention 1 and 3.
HYBRID_TARGET = dict(arch="qwen35", n_layers=4, hidden=64, n_heads=2, n_kv_heads=1, head_dim=32, rope_dim=16, ffn=128,
                     ssm_state=16, ssm_k_heads=1, ssm_v_heads=2, full_attn_interval=2, vocab_size=320, seed=1,
                     name="spec-hybrid-target")
HYBRID_DRAFT = dict(HYBRID_TARGET, n_layers=2, name="spec-hybrid-draft")   # same seed: its first layers
