"""labctl.models.cost: the Opus per-port cost model. The seed's H200/400G case against the paper's 4.3x /
23.9x, the inventory's own port counts, and a prices file that is wrong in one line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from labctl.core.errors import InputError
from labctl.core.shipped import builtin_inventory
from labctl.inventory.schema import load_inventory
from labctl.models.cost import (
    default_prices_path,
    electrical_ports_per_endpoint,
    from_inventory,
    load_prices,
    notes,
    synthetic,
)


def test_the_shipped_prices_are_table_2_with_their_sources() -> None:
    prices = load_prices()
    assert (prices.switch_port.usd, prices.switch_port.watts) == (583, 39.4)
    assert (prices.transceiver.usd, prices.transceiver.watts) == (719, 10)
    assert (prices.ocs_port.usd, prices.ocs_port.watts) == (520, 0.39)
    assert all("Table 2" in item.source for item in (prices.switch_port, prices.transceiver, prices.ocs_port))
    assert prices.rate_gbps == 400 and prices.published is not None


def test_the_seed_case_h200_400g_512_gpus() -> None:
    """Opus per GPU: 2 OCS ports and 1 transceiver ($1,759, 10.78 W). A 3-tier electrical fat tree per GPU:
    5 switch ports and 6 transceivers ($7,229, 257 W). Power agrees with the paper's 23.9x to 0.3 %; cost
    is 4.11x against 4.3x, and the note says which switch-port counts each published ratio needs."""
    result = synthetic(512, load_prices())
    assert result.photonic.cost_usd == 512 * 1759
    assert result.photonic.power_w == pytest.approx(512 * 10.78)
    assert result.electrical.switch_ports == 5 * 512 and result.electrical.transceivers == 6 * 512
    assert result.electrical.cost_usd == 512 * 7229
    assert result.electrical.power_w == pytest.approx(512 * 257.0)
    assert round(result.cost_ratio, 2) == 4.11
    assert round(result.power_ratio, 2) == 23.84
    assert result.power_ratio == pytest.approx(23.9, rel=0.003)  # the paper's power figure
    assert result.cost_ratio == pytest.approx(4.3, rel=0.05)  # ... and its cost figure, 4.4 % off
    (published,) = notes(result)
    assert "4.3x cost, 23.9x power" in published and "5.26" in published and "5.01" in published


def test_ratios_do_not_depend_on_scale_but_on_tiers() -> None:
    prices = load_prices()
    assert synthetic(64, prices).cost_ratio == pytest.approx(synthetic(512, prices).cost_ratio)
    two = synthetic(64, prices, tiers=2)
    assert (round(two.cost_ratio, 2), round(two.power_ratio, 2)) == (2.63, 14.68)
    assert [electrical_ports_per_endpoint(t) for t in (1, 2, 3)] == [1, 3, 5]
    with pytest.raises(InputError, match="at least one switch tier"):
        electrical_ports_per_endpoint(0)


def test_the_inventory_counts_its_own_ocs_ports_and_gpus() -> None:
    """The built-in lab: 8 GPUs, 16 NIC ports at 100G, each port's fibres on an ingress and an egress port
    (32 OCS ports). Two NIC ports per GPU, so twice the paper's per-GPU figures, and the same ratios."""
    result = from_inventory(load_inventory(builtin_inventory()), load_prices())
    assert (result.gpus, result.nic_ports, result.photonic.ocs_ports) == (8, 16, 32)
    assert result.photonic.transceivers == 16 and result.electrical.switch_ports == 80
    assert result.photonic.cost_usd / result.gpus == 2 * 1759
    rate_note, _ = notes(result)
    assert "400G" in rate_note and "100G" in rate_note


def test_a_bad_prices_file_is_one_line_naming_file_and_line(tmp_path: Path) -> None:
    text = default_prices_path().read_text().replace("watts: 39.4", "watts: -1")
    bad = tmp_path / "prices.yaml"
    bad.write_text(text)
    with pytest.raises(InputError) as e:
        load_prices(bad)
    message = str(e.value)
    line = next(i for i, s in enumerate(text.splitlines(), 1) if "watts: -1" in s)
    assert "\n" not in message and f"prices.yaml:{line}" in message and "switch_port.watts" in message


def test_cli_prints_the_table_and_json(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from labctl import cli

    monkeypatch.setattr(sys, "argv", ["labctl", "cost", "--gpus", "512"])
    cli.main()
    text = capsys.readouterr().out
    assert "3-tier fat tree" in text and "7,229" in text and "1,759" in text
    assert "4.11x lower cost, 23.84x lower power" in text

    monkeypatch.setattr(sys, "argv", ["labctl", "cost", "--json"])
    cli.main()
    data = json.loads(capsys.readouterr().out)
    assert data["gpus"] == 8 and data["photonic"]["ocs_ports"] == 32
    assert data["power_ratio"] == pytest.approx(23.84, abs=0.005)

    monkeypatch.setattr(sys, "argv", ["labctl", "cost", "--prices", "/nonexistent/prices.yaml"])
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.count("\n") == 1
