"""Speculative decoding: drafters (drafter.py interface, ngram.py, draft_model.py, dflash_drafter.py,
mtp_drafter.py), the DDTree builder (tree.py), acceptance (accept.py) and the decode loop that ties them
to the target (decoder.py)."""
