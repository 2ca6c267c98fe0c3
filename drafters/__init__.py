"""Drafter files that ship with flashd (clients/registry.py: KnownModel.bundled).

qwen2.5-coder-1.5b-dflash.gguf -- a DFlash block drafter for Qwen2.5-Coder-1.5B-Instruct, made by
`flashd train-drafter` with its default recipe in 17 minutes on one H200 (4.4 min generating 6.1 M answer
tokens by self-distillation from prompts rendered out of the interpreter's own Python and C sources --
source continuations, chat requests, function headers and word problems --, 10.9 min training):
3 layers, block 16, target layers [1, 7, 13, 19, 25], Q8_0, 52,696,864 bytes, held-out accept
length 3.12. README, "Train a DFlash drafter", says how to make one for another target;
bench/results holds its training log and what it accepts.
"""
