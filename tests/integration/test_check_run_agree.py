"""`labctl inventory check` and `labctl run` accept and refuse exactly the same inventories.

Every combination of lab kind (each registered one and an unknown one) and switch driver (each registered
one and an unknown one), with and without `emulate`, a broker, NIC addresses: what `inventory check`
refuses, `run` refuses before it writes anything, with the same line; what it accepts, `run` builds.
"""

from __future__ import annotations

import itertools
import random
import subprocess
import sys
from pathlib import Path

import pytest

from labctl.core.errors import InputError
from labctl.labs import build_lab, lab_kinds, load
from labctl.labs.base import LabContext
from labctl.ocs.switches import switch_drivers
from labctl.probes.sampling import ProbeSettings
from labctl.run.lifecycle import run_experiment

EXPERIMENT = """
name: agree
phases:
  a: {pairs: [[h1, h2]]}
baseline: a
cycle: [a]
"""


SECRET = "LABCTL_TEST_AGREE_SECRET"


def inventory(
    kind: str, driver: str, emulate: bool | None, broker: bool, addresses: bool, secret: str = ""
) -> str:
    """`secret`: "" none, or "set"/"unset": a switch password `${LABCTL_TEST_AGREE_SECRET}` that the
    environment has or lacks."""
    switch = f"{{driver: {driver}, size: 4x4" + (
        "" if emulate is None else f", emulate: {str(emulate).lower()}"
    )
    if emulate is False:
        switch += ", address: 192.0.2.1, user: admin"  # a switch at an address (never contacted here)
    if secret:
        switch += f", password: '${{{SECRET}}}'"
    address = ", address: 10.9.0.{}/24" if addresses else ""
    return (
        f"lab: agree\nkind: {kind}\nswitches:\n  ocs1: {switch}}}\n"
        + ("broker: {url: 'mqtt://127.0.0.1:1'}\n" if broker else "")
        + "hosts:\n"
        + f"  h1: {{nics: [{{ifname: p0, rail: 0, switch: ocs1, tx: 1, rx: 5{address.format(1)}}}]}}\n"
        + f"  h2: {{nics: [{{ifname: p0, rail: 0, switch: ocs1, tx: 2, rx: 6{address.format(2)}}}]}}\n"
    )


def _emulate_values(driver: str) -> list[bool | None]:
    if driver not in switch_drivers or "emulate" not in switch_drivers.get(driver).config.model_fields:
        return [None]
    return [None, True, False]


Case = tuple[str, str, bool | None, bool, bool, str]
CASES: list[Case] = [
    (kind, driver, emulate, broker, addresses, "")
    for kind, driver in itertools.product(
        [*lab_kinds.names(), "no-such-kind"], [*switch_drivers, "no-such-driver"]
    )
    for emulate in _emulate_values(driver)
    for broker, addresses in itertools.product((False, True), repeat=2)
] + [  # a secret the run will need, in the environment or not: check must find what run will find
    (kind, driver, emulate, bool(lab_kinds.get(kind).agent_probes), True, secret)
    for kind in lab_kinds.names()
    for driver in switch_drivers
    if "password" in switch_drivers.get(driver).config.model_fields
    for emulate in (True, False)
    for secret in ("set", "unset")
]


@pytest.fixture(autouse=True)
def _secret_for_set_cases(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    case = getattr(request.node, "callspec", None)
    if case is not None and case.params.get("case", ("",) * 6)[5] == "set":
        monkeypatch.setenv(SECRET, "agree-s3cret")
    else:
        monkeypatch.delenv(SECRET, raising=False)


def test_the_cases_cover_every_registered_name_and_both_outcomes(tmp_path: Path) -> None:
    assert {c[0] for c in CASES} >= set(lab_kinds.names()) and {c[1] for c in CASES} >= set(switch_drivers)
    outcomes = set()
    for i, case in enumerate(CASES):
        path = tmp_path / f"{i}.yaml"
        path.write_text(inventory(*case))
        try:
            load(path)
            outcomes.add("accepted")
        except InputError:
            outcomes.add("refused")
    assert outcomes == {"accepted", "refused"}


@pytest.mark.parametrize("case", CASES, ids=["-".join(map(str, c)) for c in CASES])
async def test_check_and_run_agree(tmp_path: Path, case: Case) -> None:
    path = tmp_path / "inventory.yaml"
    path.write_text(inventory(*case))
    experiment = tmp_path / "experiment.yaml"
    experiment.write_text(EXPERIMENT)
    refused: str | None = None
    try:
        inv = load(path)  # exactly what `labctl inventory check` runs
    except InputError as e:
        refused = str(e)
    if refused is not None:
        with pytest.raises(InputError) as run_refused:
            await run_experiment(experiment, path, out_dir=tmp_path / "runs", plots=False)
        assert str(run_refused.value) == refused
        assert not (tmp_path / "runs").exists(), "input errors surface before anything is written"
        return
    if inv.kind == "simulated":  # cheap to run for real: the whole run must go through
        outcome = await run_experiment(
            experiment, path, out_dir=tmp_path / "runs", plots=False, profile="fast"
        )
        assert outcome.status == "completed", outcome.error
        return
    # Other kinds need root (kernel) or a broker (agents): the run builds the lab without an input error
    # (and building touches nothing: fabrics, emulators and hubs start with the lab, not here).
    ctx = LabContext(inv, inv.profile("fast"), random.Random(1), lambda e: None, ProbeSettings())
    lab = build_lab(ctx)
    try:
        assert set(lab.switches) == {"ocs1"} and lab.probes
    finally:
        lab.close()


@pytest.mark.parametrize(
    "case",
    [("simulated", "sim", None, False, False, ""), ("simulated", "sim", None, True, False, "")],
    ids=["accepted", "refused"],
)
def test_cli_check_and_run_exit_alike(
    tmp_path: Path, repo: Path, case: tuple[str, str, None, bool, bool]
) -> None:
    """The same through the command line: exit 0 from `check` and a run that goes; or exit 2 and one
    identical line from both."""
    path = tmp_path / "inventory.yaml"
    path.write_text(inventory(*case))
    experiment = tmp_path / "experiment.yaml"
    experiment.write_text(EXPERIMENT)
    labctl = [sys.executable, "-m", "labctl.cli"]
    check = subprocess.run(
        [*labctl, "inventory", "check", str(path)], capture_output=True, text=True, timeout=60
    )
    run = subprocess.run(
        [
            *labctl,
            "run",
            str(experiment),
            "-i",
            str(path),
            "--profile",
            "fast",
            "--out",
            str(tmp_path / "runs"),
            "--no-plots",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if check.returncode == 0:
        assert run.returncode == 0, run.stderr
    else:
        assert check.returncode == run.returncode == 2
        assert check.stderr == run.stderr and check.stderr.count("\n") == 1, (check.stderr, run.stderr)
