"""Request and message ids: a per-process prefix and a counter, so a forked process (the suite's pre-loaded
parent of its daemons, any pre-forking launcher) must not hand out its parent's ids."""

from __future__ import annotations

import os
import re

from coderouterd.ids import new_id


def test_a_forked_child_has_its_own_prefix_and_counter():
    parent = new_id("req")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its first id, then out without running anything of pytest's
        try:
            os.write(w, new_id("req").encode())
        finally:
            os._exit(0)
    os.close(w)
    child = os.read(r, 200).decode()
    os.close(r)
    os.waitpid(pid, 0)
    after = new_id("req")
    prefix = len("req_") + 12
    assert child[:prefix] != parent[:prefix]
    assert child.endswith(f"{1:012x}")  # its counter starts again
    assert after[:prefix] == parent[:prefix] and after != parent  # the parent's go on as they were


def test_hex24_is_the_24_hex_digit_tail_of_wire_ids_and_never_repeats():
    from coderouterd.ids import hex24

    ids = [hex24() for _ in range(1000)]
    assert all(re.fullmatch(r"[0-9a-f]{24}", i) for i in ids)
    assert len(set(ids)) == len(ids)
