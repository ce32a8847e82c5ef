"""labctl.analysis.vcd on hand-made events: one identifier each, heartbeats are no change, time only
moves forward, a wire is x until observed."""

from __future__ import annotations

import pandas as pd

from labctl.analysis.vcd import _identifier, vcd_lines

MS = 1_000_000


def test_identifiers_are_unique_printable_codes() -> None:
    codes = [_identifier(n) for n in range(20_000)]
    assert len(set(codes)) == len(codes)
    assert all(33 <= ord(c) <= 126 for code in codes for c in code)
    assert codes[:2] == ["!", '"'] and codes[94] == "!!"


def test_changes_in_time_order_once_each() -> None:
    rows = [
        ("traffic.ok", "nic:h1/eth0", "h1", 7, 5 * MS),  # logged before an earlier event from elsewhere
        ("rx_power", "nic:h1/eth0", "h1", -30.0, 1 * MS),
        ("rx_power", "nic:h1/eth0", "h1", -3.0, 3 * MS),
        ("rx_power", "nic:h1/eth0", "h1", -3.1, 4 * MS),  # still above -10 dBm: no change
        ("carrier", "nic:h1/eth0", "h1", 1, 4 * MS),
        ("ocs.command", "ocs:ocs1", "", 16, 0),  # not a port's signal
    ]
    frame = pd.DataFrame(rows, columns=["kind", "source", "host", "value", "t_ns"])
    lines = list(vcd_lines(frame, origin_ns=0, threshold_dbm=-10.0, run_id="r"))
    body = lines[lines.index("$enddefinitions $end") + 1 :]
    assert body == ["#0", "$dumpvars", "x!", 'x"', "x#", "x$", "$end",
                    f"#{1 * MS}", "0!", f"#{3 * MS}", "1!", f"#{4 * MS}", "1#", f"#{5 * MS}", "1$"]  # fmt: skip
