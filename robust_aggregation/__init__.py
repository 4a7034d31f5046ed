"""Robust aggregation math, torch only: CenteredClip (:mod:`.centered_clip`), reducer proofs
(:mod:`.reducer_proof`), senders' alignment over rounds (:mod:`.alignment`) and members' checks of a
reducer's reply (:mod:`.reply_check`). hivemind's reducer built on it is in :mod:`hivemind_adapter`."""
