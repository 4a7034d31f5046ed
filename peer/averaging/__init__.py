"""A round's averaging topology: the cohort stage, the cross-cohort tree and the broadcasts back
(:mod:`.hierarchy`), one hivemind step at a time (:mod:`.stage`) within deadlines learnt from recent
rounds (:mod:`.deadlines`); known groups for outer tasks' inner steps (:mod:`.known_cohort`); the
values it hands on (:mod:`.outcome`); and where averagers are built (:mod:`.factory`). Whether a
result commits is :mod:`peer.commit`'s; what to do about dishonest partners, :mod:`peer.guard`'s."""
