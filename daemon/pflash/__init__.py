"""PFlash speculative prefill (ARCHITECTURE.md, PFlash): a small drafter scores the prompt's tokens and only
the most important 32-token chunks are prefilled by the target.

    config.py       PFlashConfig (block size, alpha, sink/window, tail, chunking), checked
    flashprefill.py numpy FlashPrefill: mean_K, score, select, block-sparse attention (the
                    reference backend's op and the CUDA kernels' oracle)
    selection.py    token importance from tail attention -> kept chunks
    drafter.py      the drafter model: chunked forward with FlashPrefill attention + tail scoring
    service.py      what the engine calls: load/park/free the drafter, compress ids (the length band's setting)
    needles.py      needle-in-a-haystack cases (single, multi, multi-all, two-hop) and their answer checks
    calibrate.py    `flashd pflash-calibrate`'s measurement: per length, the cheapest layer window and keep
    calibration_store.py  the stored calibration (per drafter file and RoPE scaling) -> PFlashConfig.bands
    calibrate_command.py  the `flashd pflash-calibrate` command line
"""
