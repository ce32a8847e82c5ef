"""Every command the README and docs/ show in a shell block does what the text says (issue 45).

Each fenced `sh`/`bash` block of README.md and docs/**/*.md is split into commands (a trailing `\\` or an
indented line continues one; a `# ...` comment ends it), and each command is one of:

- a synopsis (`labctl report RUN... [--json]`: placeholders in capitals, [optional] parts, a|b choices):
  every command path it names (each choice) has a `--help`, and every `--option` it shows is in that help;
- RUN: run as written with the interpreter's own `labctl` (sys.executable's sibling), in a lab directory
  of `labctl init` (plus the clone's experiments/ files that init does not write: the README's commands
  are written in a clone), with the exit code the text gives (0 unless said);
- DRY: a `labctl run` that would take long or need root, run with `--dry-run` (the files, the lab, the
  profile and the plan check out; nothing is sent);
- SKIP: needs hardware, root, the network, an install or a long run: an explicit, reviewed reason each.

A concrete command in none of them fails the test, so the docs cannot drift from what runs without someone
deciding here. A few commands the prose names inline, on the one run they share (`labctl run
reconfig-timeline --profile fast`), are INLINE. Where a doc shows what a command prints (the README's
breakdown table, the agent clocks table, or an output block right after a command's block), the shape of
what labctl prints is compared with it: the columns and their order, the rows' first words, never the
numbers. Supersedes tests/integration/test_readme_examples.py (issue 26's table check).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
LABCTL = str(Path(sys.executable).with_name("labctl"))
SHELLS = ("sh", "bash", "shell", "console")
FENCE = re.compile(r"^\s*```(\w*)\s*$")
ENV = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}

# One fast run (~7 s) and some 25 short commands (~20 s on two idle cores), on one xdist worker: the run
# is a module fixture, shared by every test that needs a run directory.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("documented_commands")]


@dataclass(frozen=True)
class Documented:
    text: str  # the command as written, continuation lines joined, its comment left out
    where: str  # file:line
    output: tuple[str, ...] | None  # the plain block right after the command's block, for its last command


def _blocks(path: Path) -> Iterator[tuple[str, int, list[str], list[str] | None]]:
    """(language, first line, body, the plain block right after it or None) of each fenced block."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[tuple[str, int, int, list[str]]] = []
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if match is None:
            i += 1
            continue
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith("```"):
            j += 1
        found.append((match.group(1), i + 2, j, lines[i + 1 : j]))
        i = j + 1
    for k, (lang, first, end, body) in enumerate(found):
        after = None
        if k + 1 < len(found):
            nxt_lang, nxt_first, _, nxt_body = found[k + 1]
            between = lines[end + 1 : nxt_first - 2]
            if nxt_lang in ("", "text") and not any(line.strip() for line in between):
                after = nxt_body
        yield lang, first, body, after


def _strip_comment(line: str) -> str:
    """The line without its trailing `# comment` (a # inside quotes or a word stays)."""
    quote = None
    for k, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (k == 0 or line[k - 1].isspace()):
            return line[:k].rstrip()
    return line.rstrip()


def documented() -> list[Documented]:
    commands: list[Documented] = []
    for path in DOCS:
        rel = path.relative_to(REPO).as_posix()
        for lang, first, body, after in _blocks(path):
            if lang not in SHELLS:
                continue
            block: list[Documented] = []
            pending: tuple[str, int] | None = None
            for n, raw in enumerate(body):
                line = _strip_comment(raw)
                if not line.strip():
                    continue
                if pending and (pending[0].endswith("\\") or raw[:1].isspace()):
                    pending = (pending[0].removesuffix("\\").rstrip() + " " + line.strip(), pending[1])
                    continue
                if pending:
                    block.append(Documented(" ".join(pending[0].split()), f"{rel}:{pending[1]}", None))
                pending = (line.strip(), first + n)
            if pending:
                block.append(Documented(" ".join(pending[0].split()), f"{rel}:{pending[1]}", None))
            if block and after is not None:
                last = block[-1]
                block[-1] = Documented(last.text, last.where, tuple(after))
            commands += block
    return commands


PLACEHOLDER = re.compile(r"^[A-Z][A-Z_]*(\.\.\.|…)?$")


def is_synopsis(text: str) -> bool:
    """A usage line of labctl's, not a command to run: a placeholder in capitals, [optional], a|b, `...`."""
    words = text.removeprefix("sudo ").split()
    if not words or words[0] != "labctl":
        return False
    return any(
        PLACEHOLDER.match(w) or "[" in w or "|" in w or w in ("...", "…") or w.endswith("...") for w in words
    )


# -- concrete commands: what each one is here --------------------------------------------------------------

RUN: dict[str, int] = {
    # command as documented → the exit code the text gives
    "labctl --help": 0,
    "labctl plan fold --dims 3,2": 0,
    "labctl plan hypercube --dim 5 --fold 11111": 0,
    "labctl plan circulant -n 576 --ports 36": 0,
    "labctl plan ep-rings -E 10440 -G 72": 0,
    "labctl plan ring -n 8 -i inventory.yaml --out ring.yaml": 0,
    "labctl replay model opus-testbed": 0,
    "labctl whatif --provisioning": 0,
    "labctl whatif runs/ --job config-2 --draw --json": 0,
    "labctl plugins": 0,
}

DRY: dict[str, str] = {
    # `labctl run ...` → why it runs here as --dry-run
    "labctl run experiments/reconfig-timeline.yaml -i experiments/inventories/tl1-emulated.yaml --profile fast": (
        "a full run over each protocol's emulator is tests/integration/test_protocol_parity.py's"
    ),
    "labctl run experiments/reconfig-timeline.yaml -i experiments/inventories/netconf-emulated.yaml --profile fast": (
        "as tl1-emulated"
    ),
    "labctl run experiments/reconfig-timeline.yaml -i experiments/inventories/scpi-emulated.yaml --profile fast": (
        "as tl1-emulated"
    ),
    "labctl run experiments/reconfig-timeline.yaml -i experiments/inventories/serial-emulated.yaml --profile fast": (
        "as tl1-emulated"
    ),
    "sudo labctl run experiments/reconfig-timeline.yaml -i experiments/inventories/emulated.yaml --profile emulated-fast": (
        "the run needs root (network namespaces); the dry run does not"
    ),
    "labctl run experiments/replay-opus-testbed.yaml --profile fast": (
        "a replay run is tests/integration/test_workload_replay.py's"
    ),
    "labctl run experiments/replay-opus-testbed-linkup.yaml": "about 40 s (the opus-testbed firmware link-up)",
    "labctl run reconfig-timeline": "about a minute (the opus-testbed profile); the fast one runs below",
    # docs/how-to/tune.md
    "labctl tune tune-autoneg-fec --profile fast": "a tune run is tests/integration/test_tune_cli.py's",
}

SKIP: dict[str, str] = {
    # command as documented → why it does not run here
    # docs/dashboard.md: servers that run until stopped, and a request to one on another host
    **dict.fromkeys(
        ("labctl serve --http 8080", "labctl dashboard runs/ --http 8080"),
        "a server that runs until stopped: tests/integration/test_dashboard.py starts both on a free port",
    ),
    "labctl serve --http 0.0.0.0:8080 --token-file ~/.config/labctl/dashboard.token": (
        "listens on every address (tests bind 127.0.0.1 only); tests/integration/test_dashboard.py checks the "
        "token rules"
    ),
    'curl -X POST -H "X-Labctl-Token: $(cat ~/.config/labctl/dashboard.token)" '
    "http://labhost:8080/api/jobs/12/cancel": (
        "a serve with a token on host labhost; tests/integration/test_dashboard.py posts with and without one"
    ),
    "python3 -m pip install -e . && labctl run experiments/reconfig-timeline.yaml": (
        "installs into the environment; the run takes a minute (the fast run below is the same experiment)"
    ),
    "python3 -m pip install -q uv -c constraints.txt && python3 -m uv pip install -q --python python3 --compile-bytecode -e '.[test]' -c constraints.txt && python3 -m pytest -n 3": (
        "installs, and runs this whole suite"
    ),
    # docs/tutorial/: each step's commands build on the ones before (a lab directory, a broker, agents, a
    # queue in the home directory), so they run in order, as one script, in tests/integration/test_tutorial.py
    **dict.fromkeys(
        (
            "python3 -m pip install -e .",
            "mkdir -p ~/labctl-tutorial && cd ~/labctl-tutorial",
            "labctl run reconfig-timeline --profile fast",
            "ls runs/*/",
            "labctl report",
            "cd ~/labctl-tutorial",
            "labctl init mylab",
            "cd mylab",
            "sed -i 's/^lab: opus-testbed$/lab: mylab/' inventory.yaml",
            "printf 'profiles:\\n my-nic: {extends: fast, firmware_up_ms: [20, 30]}\\n' >> inventory.yaml",
            "labctl inventory check",
            "labctl run experiments/reconfig-timeline.yaml --profile fast",
            "labctl run experiments/reconfig-timeline.yaml --profile my-nic",
            "labctl runs",
            "labctl compare --experiment reconfig-timeline profile=fast vs profile=my-nic",
            "cd ~/labctl-tutorial/mylab",
            "printf 'listener 1883 127.0.0.1\\nallow_anonymous true\\nset_tcp_nodelay true\\n' > mosquitto.conf",
            "mosquitto -c mosquitto.conf 2> mosquitto.log &",
            "{ cat inventory.yaml; printf 'kind: agents\\nbroker: {url: \"mqtt://127.0.0.1:1883\"}\\n'; } > agents.yaml",
            "labctl inventory check agents.yaml",
            "for h in h1 h2 h3 h4; do labctl agent --host $h -i agents.yaml 2> agent-$h.log & done",
            "labctl run experiments/reconfig-timeline.yaml -i agents.yaml --profile fast",
            "kill $(jobs -p)",
            "labctl submit experiments/reconfig-timeline.yaml --profile fast --name quick",
            "labctl submit experiments/reconfig-timeline.yaml --profile my-nic --name quick-nic --priority 10",
            "labctl submit experiments/reconfig-timeline.yaml --cron '0 2 * * *' --name nightly",
            "labctl queue",
            "labctl cancel nightly",
            "labctl serve --exit-when-idle",
            "labctl history",
            "labctl report --experiment reconfig-timeline --profile fast",
        ),
        "the tutorial, run end to end and in order by tests/integration/test_tutorial.py",
    ),
    "export POLATIS_PASSWORD=... LABCTL_MQTT_KEY=...": "a real lab's secrets",
    "labctl lab check -i opus.yaml": "a real lab (opus.yaml, its switch and agents)",
    "labctl run experiments/reconfig-timeline.yaml -i opus.yaml --dry-run": "a real lab's opus.yaml",
    "labctl run experiments/reconfig-timeline.yaml -i opus.yaml": "a real lab",
    "labctl lab broker-config -i opus.yaml --out /etc/mosquitto/labctl --tls-cert /etc/mosquitto/server.pem "
    "--tls-key /etc/mosquitto/server.key --tls-ca /etc/labctl/ca.pem --require-client-cert": (
        "a real lab's opus.yaml and certificates, writing /etc (tests/integration/test_broker_identities.py)"
    ),
    "chown -R mosquitto: /etc/mosquitto/labctl && mosquitto -c /etc/mosquitto/labctl/mosquitto.conf": (
        "root, a system mosquitto"
    ),
    "POLATIS_PASSWORD=secret labctl emulate ocs --protocol netconf --port 8830": (
        "serves until Ctrl-C (tests/integration/test_ocs_cli_protocols.py)"
    ),
    "labctl emulate ocs --protocol serial --size 8x8": "serves until Ctrl-C (test_ocs_cli_protocols.py)",
    "labctl replay sweep experiments/fig10.yaml --profile fast": (
        "minutes: a run per switching delay (tests/integration/test_workload_sweep.py sweeps a small one)"
    ),
    "labctl replay import-kineto rank0.json --job job.yaml -o trace.yaml": (
        "needs the user's PyTorch profiler trace and job file (tests/unit/test_kineto.py has fixtures)"
    ),
    "sed 's/transport: udp/transport: rdma/' experiments/reconfig-timeline.yaml > /tmp/rdma.yaml": (
        "writes into /tmp for the root run below (tests/emulated/ runs rdma on the kernel lab)"
    ),
    "sudo labctl run /tmp/rdma.yaml -i experiments/inventories/emulated.yaml --profile fast": "root",
    "ruff check . && ruff format --check .": "the linters: .ci/run runs them",
    "mypy labctl": "the type check: .ci/run runs it",
    "python3 -m pytest tests/unit": "this suite's own tier",
    "python3 -m pytest -n 3": "this whole suite",
    "python3 bench/events.py": "a benchmark (tests/integration/test_bench_scripts.py checks each one's --help)",
    "python3 bench/tl1.py": "a benchmark",
    "python3 bench/protocols.py": "a benchmark",
    "python3 bench/plans.py": "a benchmark",
    "sudo python3 bench/carrier.py": "a benchmark, root",
    "sudo python3 bench/traffic.py": "a benchmark, root",
    "sudo python3 bench/dom.py": "a benchmark, root (test_bench_dom_without_ethtool below: its missing tools)",
    "python3 bench/mqtt.py": "a benchmark, mosquitto",
    "python3 bench/agents.py": "a benchmark, mosquitto",
    "python3 bench/scale.py": "a benchmark, minutes",
    "python3 bench/all.py": "every benchmark, minutes",
    "python3 bench/overhead.py": "a benchmark",
    "python3 bench/replay.py": "a benchmark",
    "python3 bench/interrupt.py": "a benchmark: 20 opus-testbed runs interrupted",
    "python3 bench/inputs.py": "a benchmark",
    "python3 bench/gpu_device_check.py": "a CUDA GPU",
    "labctl --install-completion bash": "writes the user's shell startup file",
    "sudo -E python3 experiments/rehearsal.py up|down": "root, minutes (tests/emulated/test_rehearsal_script.py)",
    # docs/extending.md: the example plugin package
    "pip install './examples/labctl-loopback[test]'": (
        "installs into the environment (tests/integration/test_plugin_package.py installs it in a venv of its own)"
    ),
    "cd examples/labctl-loopback && python -m pytest": "the example package's own suite (test_plugin_package.py)",
    # docs/systemd/README.md: installing the services on a lab's machines
    "pip install /path/to/labctl-clone": "installs into the machine's Python",
    "sudo install -d -m 0750 /etc/labctl": "root, /etc",
    "sudo cp inventory.yaml /etc/labctl/inventory.yaml": "root, /etc",
    "sudo cp docs/systemd/labctl-agent.service /etc/systemd/system/": "root, systemd",
    "sudo cp docs/systemd/labctl-serve.service /etc/systemd/system/": "root, systemd",
    "sudo systemctl daemon-reload": "root, systemd",
    "sudo systemctl enable --now labctl-agent": "root, systemd",
    "sudo install -m 0600 /dev/null /etc/labctl/agent.env": "root, /etc",
    "sudoedit /etc/labctl/agent.env": "an editor, root",
    "LAB_BROKER_USER=agent": "a line of the environment file shown, not a command",
    "LAB_BROKER_PASSWORD=...": "a line of the environment file shown, not a command",
    "LAB_AUTH_KEY=...": "a line of the environment file shown, not a command",
    "journalctl -u labctl-serve -f -o cat": "systemd's journal of an installed service",
    "journalctl -u labctl-serve -o cat | jq -c 'select(.run_id == 12)'": "systemd's journal",
    'journalctl -u labctl-agent -o cat | jq -r \'select(.level != "info") | "\\(.ts) \\(.msg)"\'': (
        "systemd's journal"
    ),
}

INLINE: list[tuple[str, str, int]] = [
    # (doc, command as its prose names it, exit code): run on the shared run, in this order
    ("docs/results.md", "labctl report runs/", 0),
    ("README.md", "labctl report", 0),
    ("docs/results.md", "labctl runs", 0),
    ("docs/results.md", "labctl report --experiment reconfig-timeline --since monday", 0),
    ("README.md", "labctl export RUN", 0),
    ("docs/reference.md", "labctl schema inventory --out schemas/inventory.schema.json", 0),
]


# -- the lab directory the commands run in, and the one run they share ------------------------------------


@dataclass
class Lab:
    path: Path
    run_stdout: str

    def run(self, text: str, expect: int = 0, *, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """A documented command as a user types it, with this interpreter's labctl; `sudo ` left out."""
        argv = shlex.split(text.removeprefix("sudo "))
        assert argv[0] == "labctl", text
        done = subprocess.run(
            [LABCTL, *argv[1:]], cwd=self.path, capture_output=True, text=True, env=ENV, timeout=timeout
        )
        assert "Traceback" not in done.stderr, f"{text}:\n{done.stderr[-3000:]}"
        assert done.returncode == expect, (
            f"{text}: exit {done.returncode}\n{done.stdout[-1500:]}{done.stderr[-1500:]}"
        )
        return done


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Lab:
    """`labctl init` into a temporary directory, plus the clone's experiments/ files init leaves out (the
    README's commands are written in a clone), and `labctl run reconfig-timeline --profile fast` in it."""
    root = tmp_path_factory.mktemp("documented")
    init = subprocess.run([LABCTL, "init", "lab"], cwd=root, capture_output=True, text=True, env=ENV)
    assert init.returncode == 0, init.stderr
    path = root / "lab"
    for source in (REPO / "experiments").iterdir():
        target = path / "experiments" / source.name
        if not target.exists():
            (shutil.copytree if source.is_dir() else shutil.copy)(source, target)
    bare = Lab(path, "")
    shared = bare.run("labctl run reconfig-timeline --profile fast", timeout=300)
    return Lab(path, shared.stdout)


def _run_dir(lab: Lab) -> Path:
    (run_dir,) = (lab.path / "runs").iterdir()
    return run_dir


# -- the tests ------------------------------------------------------------------------------------------------


def test_every_documented_command_is_classified() -> None:
    """A command a doc adds (or changes) is run, dry-run, or skipped with a reason here; an entry whose
    command no doc shows any more is gone from here too."""
    commands = documented()
    assert len(commands) > 50, "the extraction found too few commands: is it still reading the blocks?"
    concrete = {c.text: c.where for c in commands if not is_synopsis(c.text)}
    classified = set(RUN) | set(DRY) | set(SKIP)
    assert not set(RUN) & set(DRY) and not (set(RUN) | set(DRY)) & set(SKIP)
    new = {text: where for text, where in concrete.items() if text not in classified}
    assert not new, "classify these documented commands in RUN, DRY or SKIP (with a reason):\n" + "\n".join(
        f"  {where}: {text!r}" for text, where in new.items()
    )
    stale = sorted(classified - set(concrete))
    assert not stale, f"no doc shows these any more; remove them here: {stale}"
    for doc, text, _ in INLINE:
        assert text in " ".join((REPO / doc).read_text(encoding="utf-8").split()), (
            f"{doc} no longer names {text}"
        )


def _paths(part: str) -> tuple[list[list[str]], list[str]]:
    """A synopsis part's command paths (each a|b choice expanded) and the options it shows."""
    words = part.split()
    path: list[list[str]] = []
    rest = words
    for k, word in enumerate(words):
        if re.fullmatch(r"[a-z][a-z0-9-]*(\|[a-z][a-z0-9-]*)*", word):
            path.append(word.split("|"))
            rest = words[k + 1 :]
        else:
            break
    # `show|connect IN OUT|disconnect PORT...|apply FILE`: the later choices of the last command word
    if path and len(path[-1]) > 1:
        for word in rest:
            path[-1] += [w for w in word.split("|")[1:] if re.fullmatch(r"[a-z][a-z0-9-]*", w)]
    options = re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*|-[a-zA-Z])\b", " ".join(rest))
    combos: list[list[str]] = [[]]
    for choices in path:
        combos = [[*combo, c] for combo in combos for c in choices]
    return combos, options


def _help(args: list[str]) -> tuple[int, str]:
    from typer.testing import CliRunner

    from labctl.cli import app

    done = CliRunner().invoke(app, [*args, "--help"], env={"COLUMNS": "200", "TERMINAL_WIDTH": "200"})
    return done.exit_code, done.output


SYNOPSES = [c for c in documented() if is_synopsis(c.text)]


@pytest.mark.parametrize("command", SYNOPSES, ids=[c.where for c in SYNOPSES])
def test_each_synopsis_names_commands_and_options_that_exist(command: Documented) -> None:
    text = command.text.removeprefix("sudo ")
    parts = re.split(r"\s+\|\s+", text)
    head = parts[0].split()[: len(_paths(parts[0].removeprefix("labctl "))[0][0])]
    for part in parts:
        if not part.startswith("labctl "):
            part = " ".join(["labctl", *head[:-1], part])  # `labctl serve | queue | cancel ID`
        combos, options = _paths(part.removeprefix("labctl "))
        helps = []
        for combo in combos:
            code, text_out = _help(combo)
            assert code == 0, f"{command.where}: `labctl {' '.join(combo)} --help` exits {code}:\n{text_out}"
            helps.append(text_out)
        for option in options:
            assert any(option in h for h in helps), (
                f"{command.where}: {part!r} shows {option}, which `labctl {' / '.join(map(' '.join, combos))} "
                "--help` does not list"
            )


@pytest.mark.parametrize("text", sorted(RUN))
def test_a_documented_command_runs(lab: Lab, text: str) -> None:
    lab.run(text, RUN[text])


@pytest.mark.parametrize("text", sorted(DRY), ids=lambda text: " ".join(text.split()[-4:]))
def test_a_documented_run_checks_out_as_a_dry_run(lab: Lab, text: str) -> None:
    done = lab.run(text + " --dry-run")
    assert done.stdout.strip(), f"{text} --dry-run printed no plan"


def test_the_commands_the_prose_names_run_on_the_shared_run(lab: Lab) -> None:
    run_dir = _run_dir(lab)
    for _, text, code in INLINE:
        done = lab.run(text.replace("RUN", str(run_dir.relative_to(lab.path))), code)
        if text.startswith("labctl report"):
            assert (
                done.stdout.startswith(f"run {run_dir.name.split('-', 2)[-1]}") or run_dir.name in done.stdout
            )
            assert "NOT synchronized" not in done.stdout  # one clock stamps every mark of a simulated run
            assert "time sync: one clock stamps every mark" in done.stdout
    assert (lab.path / "schemas" / "inventory.schema.json").is_file()
    assert (run_dir / "trace.perfetto.json").is_file()


def _table_rows(text: str) -> list[list[str]]:
    """The cells of each row of a rich table as printed (header ┃ and body │ rows)."""
    rows = []
    for line in text.splitlines():
        line = line.strip()
        if line[:1] in ("┃", "│") and line[-1:] in ("┃", "│"):
            rows.append([cell.strip() for cell in re.split("[┃│]", line.strip("┃│"))])
    return rows


def _shown(doc: str, first: str) -> str:
    """The plain block of `doc` whose text holds `first`."""
    text = (REPO / doc).read_text(encoding="utf-8")
    start = text.index(first)
    return text[start : text.index("```", start)]


def _unitless(header: str) -> str:
    return re.sub(r"\s*\((ns|µs|ms|s)\)$", "", header)


def test_the_readme_breakdown_table_is_what_the_run_prints(lab: Lab) -> None:
    """The README's example (opus-testbed profile) against the fast run: the same columns in the same
    order, the same phases over the same units and counts; the numbers are each run's own."""
    for doc in ("README.md", "docs/results.md"):  # the README's example, and the site's beside its columns
        shown = _table_rows(_shown(doc, "┃ phase"))
        printed = _table_rows(lab.run_stdout)
        assert shown and printed
        assert [_unitless(h) for h in shown[0]] == [_unitless(h) for h in printed[0]]
        assert [row[:3] for row in shown[1:]] == [row[:3] for row in printed[1:]]
        readme = (REPO / doc).read_text(encoding="utf-8")
        resolution = next(line for line in readme.splitlines() if line.startswith("mark resolution"))
        said = next(line for line in lab.run_stdout.splitlines() if line.startswith("mark resolution"))
        assert resolution.split(":")[0] == said.split(":")[0]


def test_the_readme_agent_clocks_table_is_what_labctl_prints() -> None:
    """The README's agent clocks table, printed by labctl's own code from the same values: its title,
    columns, their order and units, and each row's cells."""
    from rich.console import Console

    from labctl.cli.tables import clock_table

    block = _shown("docs/how-to/real-lab.md", "agent clocks (offset")
    shown = _table_rows(block)
    header = shown[0]
    scale = {"(s)": 1e9, "(ms)": 1e6, "(µs)": 1e3, "(ns)": 1}

    def ns(cells: dict[str, str], name: str) -> int:
        key = next(h for h in header if _unitless(h) == name)
        return round(float(cells[key]) * scale.get(key.split()[-1], 1))

    records = {}
    for row in shown[1:]:
        cells = dict(zip(header, row, strict=True))
        records[cells["host"]] = {
            "source": cells["source"],
            "offset_ns": ns(cells, "offset"),
            "uncertainty_ns": ns(cells, "± uncertainty"),
            "exchange_uncertainty_ns": ns(cells, "exchange ±"),
            "rtt_min_ns": ns(cells, "fastest RTT"),
            "drift_ppb": round(float(cells["drift"].removesuffix(" ppm")) * 1000),
            "exchange_via": cells["via"],
        }
    console = Console(width=200, record=True, color_system=None)
    console.print(clock_table({"clock_offsets": records}))
    printed = console.export_text()
    assert block.splitlines()[0] == printed.splitlines()[0].rstrip()
    assert _table_rows(printed) == shown


def test_output_blocks_after_a_command_show_what_it_prints(lab: Lab) -> None:
    """Where a doc shows an output block right after a command's block, the command (run here) prints the
    same lines' first words in the same order."""
    for command in documented():
        if command.output is None or command.text not in RUN:
            continue
        done = lab.run(command.text, RUN[command.text])
        printed = [line.split()[0] for line in done.stdout.splitlines() if line.split()]
        shown = [line.split()[0] for line in command.output if line.split()]
        it = iter(printed)
        assert all(word in it for word in shown), f"{command.where}: {command.text} prints {printed[:20]}"


def test_bench_dom_without_ethtool_says_so_in_one_line(tmp_path: Path) -> None:
    """`sudo python3 bench/dom.py` where ethtool is missing: the row says so, no traceback (as bench/all.py
    says a missing tool); without root its rows say they need root."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ip = shutil.which("ip")
    if ip is not None:
        (bin_dir / "ip").symlink_to(ip)
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "dom.py"), "--rounds", "1", "--seconds", "0.02"],
        capture_output=True,
        text=True,
        env={**ENV, "PATH": str(bin_dir)},
        timeout=120,
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    (row,) = [line for line in done.stdout.splitlines() if line.startswith("ethtool -m")]
    needs = "needs root" if os.geteuid() != 0 else ("needs ethtool" if ip else "needs ip")
    assert needs in row


def test_fabric_up_without_an_inventory_lays_out_the_built_in_kernel_lab() -> None:
    """`sudo labctl emulate fabric up` as the README shows it, bare: its default inventory has the addresses a
    kernel fabric needs (the simulated default lab has none), laid out without root."""
    from labctl.cli.emulate import _fabric_inventory
    from labctl.emulators.fabric import FabricLayout, managed_prefix
    from labctl.inventory.schema import load_inventory

    inventory = load_inventory(_fabric_inventory(None))
    assert inventory.kind == "kernel"
    layout = FabricLayout.of(inventory, managed_prefix(inventory))
    assert len(layout.ports) == 16 and all(fp.port.address for fp in layout.ports)


def test_help_starts_with_a_command_that_works_outside_a_clone() -> None:
    """`labctl --help` names the built-in experiment, not a clone's path, and `labctl report` bare."""
    code, text = _help([])
    assert code == 0
    assert "labctl run reconfig-timeline" in text and "experiments/reconfig-timeline.yaml" not in text
    assert "`labctl report`" in text


def test_the_readme_layout_names_folders_that_exist() -> None:
    """Each folder the README's layout names under labctl/ is there (it named labctl/drivers/ once: it is
    labctl/ocs/drivers/)."""
    block = _shown("docs/development.md", "inventory.yaml   the default lab")
    parents: dict[int, Path] = {}
    named = 0
    for line in block.splitlines():
        match = re.match(r"^( {0,4})((?:[a-z_]+/)(?:, [a-z_]+/)*)\s", line)  # an entry, not a wrapped line
        if match is None:
            continue
        indent = len(match.group(1))
        base = parents[indent - 2] if indent else REPO
        names = re.findall(r"[a-z_]+", match.group(2))
        for name in names:
            assert (base / name).is_dir(), f"the README's layout names {(base / name).relative_to(REPO)}/"
            named += 1
        parents[indent] = base / names[0]
    assert named > 15


def test_docs_cite_no_design_file_the_repository_lacks() -> None:
    for path in DOCS:
        if "DESIGN.md" in path.read_text(encoding="utf-8"):
            assert (REPO / "DESIGN.md").exists() or (REPO / "docs" / "DESIGN.md").exists(), (
                f"{path.relative_to(REPO)} cites a DESIGN.md the repository does not have"
            )
