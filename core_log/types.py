"""Distinct number spaces get distinct names.

An ``Offset`` is a record's logical position in a partition; a ``Position`` is a byte position
inside one segment file; an ``Epoch`` is a leader epoch. Mixing them is the classic log bug.
"""

from typing import NewType

Offset = NewType("Offset", int)
Position = NewType("Position", int)
Epoch = NewType("Epoch", int)
TimestampMs = NewType("TimestampMs", int)

NO_EPOCH = Epoch(-1)
NO_TIMESTAMP = TimestampMs(-1)
