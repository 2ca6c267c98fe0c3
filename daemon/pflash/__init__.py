"""PFlash speculative prefill (ARCHITECTURE.md, PFlash): a small drafter scores the prompt's tokens and only
the most important 32-token chunks are prefilled by the target.

    config.py       PFlashConfig (block size, alpha, sink/window, tail, chunking), checked
    flashprefill.py numpy FlashPrefill: mean_K, score, select, block-sparse attention (the
                    reference backend's op and the CUDA kernels' oracle)
    selection.py    token importance from tail attention -> kept chunks
    drafter.py      the drafter model: chunked forward with FlashPrefill attention + tail scoring
    service.py      what the engine calls: load/park/free the drafter, compress ids
"""
