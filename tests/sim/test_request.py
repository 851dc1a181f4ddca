"""sim.core.request.arriving makes the same Request as the constructor."""

import dataclasses

from sim.core.request import Request, Status, arriving


def test_arriving_matches_the_constructor_field_by_field():
    segments = (((0, 7), 0, 100),)
    for deadline, cancel, shareable, adapter in ((None, None, 0, None), (3.5, 9.0, None, 2)):
        want = Request(7, 1.25, 100, 20, 1.5, deadline_s=deadline, cancel_at_s=cancel, segments=segments,
                       shareable_tokens=shareable, adapter=adapter)
        got = arriving(7, 1.25, 100, 20, 1.5, deadline, cancel, segments, shareable, adapter)
        for f in dataclasses.fields(Request):  # every field set (a slot left unset would raise here)
            assert getattr(got, f.name) == getattr(want, f.name), f.name
            assert type(getattr(got, f.name)) is type(getattr(want, f.name)), f.name
        assert got.status is Status.WAITING
        assert got.block_table is not want.block_table and got.block_hashes is not got.block_table
        assert got.block_table == [] and got.block_hashes == []
