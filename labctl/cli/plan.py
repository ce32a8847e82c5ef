"""`labctl plan …`: workload-static circuit plans (hypercube, folded cube, block folds, Hamming products,
circulants, rings) and Opus's expert-parallel divergent rings, as mappings a lab applies once."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from labctl.cli.common import JsonOpt, out
from labctl.core.errors import InputError

if TYPE_CHECKING:
    from labctl.plans.graphs import Graph
    from labctl.plans.layout import Unit

plan_app = typer.Typer(
    help="Workload-static circuit plans: circuits configured once per deployment (the decode paper's host "
    "graphs) or once per EP job (Opus §4's divergent rings). Each plan is split into one matching per OCS "
    "(port k of every accelerator on OCS k), checked, and reported with degree, diameter and pair "
    "coverage. --out writes mapping files for `labctl ocs apply FILE --switch NAME`; -i lays the plan onto "
    "an inventory's NIC ports first, within its rails.\n\n"
    "Try: `labctl plan fold --dims 3,2` (Q5[3,2] = K8□K4: degree 10, diameter 2), "
    "`labctl plan ep-rings -E 10440 -G 72`, `labctl plan ring -n 8 -i inventory.yaml --out ring.yaml`.",
    no_args_is_help=True,
)

PortsOpt = Annotated[
    int | None,
    typer.Option(
        "--ports",
        "-p",
        min=1,
        max=4096,
        help="Port budget per accelerator (each port on its own OCS); the plan must fit. Default: no "
        "budget, the ports it needs are reported.",
    ),
]
PlanInventoryOpt = Annotated[
    Path | None,
    typer.Option(
        "--inventory",
        "-i",
        help="Lay the plan onto this inventory's accelerators and NIC ports, within rails (a rail is one "
        "circuit domain): the graph is laid on each rail it uses, over that rail's first accelerators, and "
        "-n is split evenly over the fewest rails that hold it (-n 8 on 4 hosts × 2 rails: a C4 on each "
        "rail). A plan that does not fit says why and exits 2. Default: the plan's own switches, one port "
        "per accelerator each, numbered in order.",
    ),
]
UnitOpt = Annotated[
    str,
    typer.Option(
        "--unit",
        help="With -i: what one accelerator on a rail is, `gpu` (the NIC ports serving one GPU on that "
        "rail) or `host` (all the host's NIC ports on that rail).",
    ),
]
PlanOutOpt = Annotated[
    Path | None,
    typer.Option(
        "--out",
        "-o",
        help="Write the mapping: FILE for a one-switch plan, else FILE's stem + .SWITCH.yaml per switch (or "
        "DIR/SWITCH.yaml for a directory). Each file is `patches:` + `scope:` for `labctl ocs apply`.",
    ),
]


def _ints(text: str, what: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise typer.BadParameter(f"{text!r}: expected {what} as comma-separated integers, e.g. 3,2") from None
    if not values:
        raise typer.BadParameter(f"{text!r}: expected at least one integer")
    return values


def _say(text: str) -> None:
    out.print(text, markup=False, highlight=False)


def _switch_files(target: Path, switches: list[str]) -> dict[str, Path]:
    if target.is_dir():
        return {s: target / f"{s}.yaml" for s in switches}
    if len(switches) == 1:
        return {switches[0]: target}
    suffix = target.suffix or ".yaml"
    return {s: target.with_name(f"{target.stem}.{s}{suffix}") for s in switches}


def _write_files(target: Path, switch_plans: list[Any], title: str) -> list[dict[str, str]]:
    from labctl.core.fileio import atomic_path

    if not target.parent.is_dir():
        raise InputError(f"--out {target}: directory {target.parent} does not exist")
    files = _switch_files(target, [sp.switch for sp in switch_plans])
    written = []
    for sp in switch_plans:
        path = files[sp.switch]
        lines = [
            f"# {title}: switch {sp.switch} ({sp.space}), {sp.circuits} duplex circuits",
            f"# from: {'; '.join(sp.sources)}",
            f"# apply: labctl ocs apply {path} --switch {sp.switch}",
            "patches:",
            *(f"  - [{i}, {e}]" for i, e in sorted(sp.mapping)),
            f"scope: [{', '.join(map(str, sp.scope))}]",
        ]
        with atomic_path(path) as tmp:
            tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
        written.append({"switch": sp.switch, "file": str(path)})
    return written


def _switches_json(switch_plans: list[Any]) -> list[dict[str, Any]]:
    return [
        {
            "switch": sp.switch,
            "size": str(sp.space),
            "circuits": sp.circuits,
            "sources": list(sp.sources),
            "patches": [list(p) for p in sorted(sp.mapping)],
            "scope": list(sp.scope),
        }
        for sp in switch_plans
    ]


def _condensed(rows: list[list[str]], limit: int = 16, head: int = 8) -> tuple[list[list[str]], int]:
    if len(rows) <= limit:
        return rows, 0
    return rows[:head], len(rows) - head


@dataclass(frozen=True)
class _Sized:
    """A graph family sized by -n: `nodes` counts accelerators in total; on an inventory the family is
    built for each rail's share (`labctl.plans.layout.rail_share`)."""

    nodes: int
    build: Callable[[int], Graph]


def _static(
    graph_builder: Callable[[], Graph] | _Sized,
    *,
    ports: int | None,
    inventory: Path | None,
    unit: str,
    out_path: Path | None,
    as_json: bool,
) -> None:
    from labctl.plans.layout import abstract_static, inventory_static, rail_accelerators, rail_share
    from labctl.plans.matchings import check_budget, decompose
    from labctl.plans.metrics import measure

    if unit not in ("gpu", "host"):
        raise InputError(f"--unit {unit!r}: expected gpu or host")
    the_unit: Unit = "gpu" if unit == "gpu" else "host"
    t0 = time.monotonic_ns()
    inv = None
    rails: tuple[int, ...] = ()
    if inventory is not None:
        from labctl.inventory.schema import load_inventory

        inv = load_inventory(inventory)
    if isinstance(graph_builder, _Sized):
        if inv is not None:
            rails, per_rail = rail_share(inv, graph_builder.nodes, the_unit, what=f"-n {graph_builder.nodes}")
            try:
                graph = graph_builder.build(per_rail)
            except InputError as e:
                if len(rails) == 1:
                    raise
                raise InputError(
                    f"-n {graph_builder.nodes} on {inventory} is {per_rail} on each of rails "
                    f"{', '.join(map(str, rails))}: {e}"
                ) from None
        else:
            graph = graph_builder.build(graph_builder.nodes)
    else:
        graph = graph_builder()
        if inv is not None:
            rails, _ = rail_share(inv, graph.n, the_unit, split=False, what=graph.name)
    plan = decompose(graph)
    t_plan = time.monotonic_ns()
    check_budget(plan, ports)
    if inv is not None:
        switch_plans = inventory_static(plan, inv, the_unit, rails)
        by_rail = rail_accelerators(inv, the_unit)
        placed = {r: by_rail[r][: graph.n] for r in rails}
    else:
        switch_plans = abstract_static(plan)
        placed = {}
    metrics = measure(graph)
    t_done = time.monotonic_ns()
    title = f"labctl plan {graph.name}" + (f" on rails {', '.join(map(str, rails))}" if rails else "")
    files = _write_files(out_path, switch_plans, title) if out_path else []
    if as_json:
        print(
            json.dumps(
                {
                    "plan": graph.name,
                    "accelerators": graph.n * max(1, len(rails)),
                    "rails": [
                        {
                            "rail": r,
                            "switch": inv.rail_switch(r),
                            "accelerators": [a.name for a in accs],
                            "hosts": list(dict.fromkeys(a.host for a in accs)),
                        }
                        for r, accs in placed.items()
                    ]
                    if inv is not None
                    else None,
                    "degree": {"min": metrics.degree_min, "max": metrics.degree_max},
                    "diameter": metrics.diameter,
                    "pairs": {
                        "adjacent": metrics.pairs_adjacent,
                        "total": metrics.pairs_total,
                        "coverage": metrics.coverage,
                    },
                    "ports_needed": plan.ports_needed,
                    "port_budget": ports,
                    "matchings": [
                        {"ocs": k, "label": m.label, "circuits": len(m.edges), "valid": True}
                        for k, m in enumerate(plan.matchings)
                    ],
                    "switches": _switches_json(switch_plans),
                    "files": files,
                    "inventory": str(inventory) if inventory else None,
                    "plan_ns": t_plan - t0,
                    "total_ns": t_done - t0,
                },
                indent=2,
            )
        )
        return
    diameter = "disconnected" if metrics.diameter is None else str(metrics.diameter)
    deg = (
        str(metrics.degree_max)
        if metrics.degree_min == metrics.degree_max
        else f"{metrics.degree_min}..{metrics.degree_max}"
    )
    if len(rails) > 1:
        on_rails = f" on each of rails {', '.join(map(str, rails))}"
        size = f"{graph.n * len(rails)} accelerators ({graph.n} per rail)"
    else:
        on_rails = f" on rail {rails[0]}" if rails else ""
        size = f"{graph.n} accelerators"
    _say(f"{graph.name}{on_rails}: {size}, degree {deg}, diameter {diameter}")
    _say(
        f"pairs one hop apart{' on each rail' if len(rails) > 1 else ''}: {metrics.pairs_adjacent} of "
        f"{metrics.pairs_total} ({100 * metrics.coverage:.1f}%)"
    )
    budget = f"within the budget of {ports}" if ports is not None else "no budget given (--ports)"
    _say(
        f"OCS matchings: {plan.ports_needed} ({', '.join(plan.methods)}), one port per accelerator each; "
        f"{budget}; each checked as a matching"
    )
    from rich.table import Table

    table = Table(title_justify="left", show_edge=False)
    for col in ("ocs", "circuits", "from"):
        table.add_column(col)
    rows = [[str(k), str(len(m.edges)), m.label] for k, m in enumerate(plan.matchings)]
    shown, more = _condensed(rows)
    for row in shown:
        table.add_row(*(escape(c) for c in row))
    out.print(table)
    if more:
        _say(f"… {more} more matchings (--json lists all)")
    where = "on the plan's own switches:"
    if inv is not None:
        for r, accs in placed.items():
            names = [a.name for a in accs]
            _say(
                f"rail {r} ({inv.rail_switch(r)}): "
                + " ".join(names[:12])
                + (f" … ({len(names)})" if len(names) > 12 else "")
            )
        hosts = list(dict.fromkeys(a.host for accs in placed.values() for a in accs))
        shown_hosts = ", ".join(hosts[:8]) + (" …" if len(hosts) > 8 else "")
        where = f"on {inventory}: {len(hosts)} hosts ({shown_hosts}), no circuit leaves its rail;"
    _say(
        f"{where} {len(switch_plans)} switch mapping(s), "
        + ", ".join(f"{sp.switch} {len(sp.mapping)} patches" for sp in switch_plans[:6])
        + (" …" if len(switch_plans) > 6 else "")
        + f", each a valid matching ({(t_done - t0) / 1e6:.1f} ms)"
    )
    for f in files:
        _say(f"wrote {f['file']}: labctl ocs apply {f['file']} --switch {f['switch']}")


def _common_help(extra: str) -> str:
    return escape(extra + " Prints degree, diameter, one-hop pair coverage and the per-OCS matchings.")


@plan_app.command(
    "hypercube", help=_common_help("Q_d: accelerator x ~ x XOR 2^i; OCS i carries dimension i.")
)
def hypercube_cmd(
    dim: Annotated[int, typer.Option("--dim", "-d", min=1, max=12, help="Dimensions: 2^dim accelerators.")],
    fold: Annotated[
        list[str] | None,
        typer.Option(
            "--fold",
            help="Extra generator as a bit mask (Q_d + g), e.g. --fold 1100; repeatable. 11…1 is the folded "
            "cube.",
        ),
    ] = None,
    ports: PortsOpt = None,
    inventory: PlanInventoryOpt = None,
    unit: UnitOpt = "gpu",
    out_path: PlanOutOpt = None,
    as_json: JsonOpt = False,
) -> None:
    from labctl.plans.graphs import hypercube

    masks = []
    for text in fold or []:
        if not text or set(text) - {"0", "1"} or len(text) > dim:
            raise typer.BadParameter(f"{text!r}: expected a mask of at most {dim} bits, e.g. 1100")
        masks.append(int(text, 2))
    _static(
        lambda: hypercube(dim, masks),
        ports=ports,
        inventory=inventory,
        unit=unit,
        out_path=out_path,
        as_json=as_json,
    )


@plan_app.command(
    "folded-cube", help=_common_help("FQ_d = Q_d + 1…1: each accelerator also linked to its antipode.")
)
def folded_cube_cmd(
    dim: Annotated[int, typer.Option("--dim", "-d", min=2, max=12, help="Dimensions: 2^dim accelerators.")],
    ports: PortsOpt = None,
    inventory: PlanInventoryOpt = None,
    unit: UnitOpt = "gpu",
    out_path: PlanOutOpt = None,
    as_json: JsonOpt = False,
) -> None:
    from labctl.plans.graphs import folded_cube

    _static(
        lambda: folded_cube(dim),
        ports=ports,
        inventory=inventory,
        unit=unit,
        out_path=out_path,
        as_json=as_json,
    )


@plan_app.command(
    "fold",
    help=_common_help(
        "Block fold Q_n[a,b,…] = K_2^a □ K_2^b □ …: every nonzero mask inside one block of bits "
        "(--dims 3,2 is Q5[3,2] = K8□K4, degree 10, diameter 2)."
    ),
)
def fold_cmd(
    dims: Annotated[str, typer.Option("--dims", help="Block sizes in bits, most significant first: 3,2.")],
    ports: PortsOpt = None,
    inventory: PlanInventoryOpt = None,
    unit: UnitOpt = "gpu",
    out_path: PlanOutOpt = None,
    as_json: JsonOpt = False,
) -> None:
    from labctl.plans.graphs import block_fold

    blocks = _ints(dims, "block sizes")
    _static(
        lambda: block_fold(blocks),
        ports=ports,
        inventory=inventory,
        unit=unit,
        out_path=out_path,
        as_json=as_json,
    )


@plan_app.command(
    "hamming",
    help=_common_help(
        "Hamming product K_s1 □ K_s2 □ … for any factor sizes (--sizes 8,8,9: 576 accelerators, degree 22, "
        "diameter 3); each K_s split into round-robin matchings."
    ),
)
def hamming_cmd(
    sizes: Annotated[str, typer.Option("--sizes", help="Factor sizes: 8,8,9.")],
    ports: PortsOpt = None,
    inventory: PlanInventoryOpt = None,
    unit: UnitOpt = "gpu",
    out_path: PlanOutOpt = None,
    as_json: JsonOpt = False,
) -> None:
    from labctl.plans.graphs import hamming

    factors = _ints(sizes, "factor sizes")
    _static(
        lambda: hamming(factors),
        ports=ports,
        inventory=inventory,
        unit=unit,
        out_path=out_path,
        as_json=as_json,
    )


@plan_app.command(
    "circulant",
    help=_common_help(
        "Circulant C_n(S): accelerator i ~ i ± s. Without --offsets, offsets are chosen greedily for the "
        "--ports budget (most accelerators within two hops)."
    ),
)
def circulant_cmd(
    nodes: Annotated[
        int, typer.Option("-n", "--nodes", min=2, max=4096, help="Accelerators (with -i: over all rails).")
    ],
    offsets: Annotated[
        str | None, typer.Option("--offsets", help="Offsets s in 1..n/2, e.g. 1,4 (default: from --ports).")
    ] = None,
    ports: PortsOpt = None,
    inventory: PlanInventoryOpt = None,
    unit: UnitOpt = "gpu",
    out_path: PlanOutOpt = None,
    as_json: JsonOpt = False,
) -> None:
    from labctl.plans.graphs import budget_offsets, circulant

    chosen = _ints(offsets, "offsets") if offsets is not None else None
    if chosen is None and ports is None:
        raise InputError("circulant: give --offsets (e.g. 1,4) or --ports to have them chosen for a budget")

    def build(n: int) -> Graph:
        if chosen is not None:
            return circulant(n, chosen)
        assert ports is not None
        return circulant(n, budget_offsets(n, ports))

    _static(
        _Sized(nodes, build),
        ports=ports,
        inventory=inventory,
        unit=unit,
        out_path=out_path,
        as_json=as_json,
    )


@plan_app.command(
    "ring", help=_common_help("The ring C_n({1}): two ports per accelerator (three for odd n).")
)
def ring_cmd(
    nodes: Annotated[
        int, typer.Option("-n", "--nodes", min=2, max=4096, help="Accelerators (with -i: over all rails).")
    ],
    ports: PortsOpt = None,
    inventory: PlanInventoryOpt = None,
    unit: UnitOpt = "gpu",
    out_path: PlanOutOpt = None,
    as_json: JsonOpt = False,
) -> None:
    from labctl.plans.graphs import ring

    _static(
        _Sized(nodes, ring), ports=ports, inventory=inventory, unit=unit, out_path=out_path, as_json=as_json
    )


@plan_app.command("ep-rings")
def ep_rings_cmd(
    experts: Annotated[
        int | None,
        typer.Option("-E", "--experts", min=1, help="GPUs in the EP group (default with -i: G × hosts)."),
    ] = None,
    rails: Annotated[
        int | None,
        typer.Option(
            "-G", "--rails", min=1, help="Rails = GPUs per scale-up domain (default with -i: its rails)."
        ),
    ] = None,
    partial: Annotated[
        bool,
        typer.Option("--partial", help="Accept a plan that cannot cover every pair (E > G(2G+1))."),
    ] = False,
    inventory: Annotated[
        Path | None,
        typer.Option(
            "--inventory",
            "-i",
            help="Lay the rings onto this inventory: domain d = its d-th host, rail r's ring on its r-th "
            "rail's ports (default: one 2m×2m switch per rail, two ports per domain).",
        ),
    ] = None,
    out_path: PlanOutOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Opus §4 divergent rings: rail r's OCS carries a ring over the m = E/G scale-up domains, in a
    different order per rail, chosen greedily (most uncovered domain pairs first), so that every pair of
    domains is adjacent on some rail: possible when E ≤ G(2G+1) (10,440 GPUs for NVL72, G = 72). Reports
    pairs covered, rails used and each rail's ring; above the bound it says so and exits 2 (--partial
    accepts the best G rings can do)."""
    from labctl.plans.ep import full_coverage_bound, plan_ep_rings
    from labctl.plans.layout import abstract_ep, inventory_ep

    inv = None
    if inventory is not None:
        from labctl.inventory.schema import load_inventory

        inv = load_inventory(inventory)
        rails = rails if rails is not None else len(inv.rails)
        experts = experts if experts is not None else rails * len(inv.hosts)
    if experts is None or rails is None:
        raise InputError("ep-rings: give -E GPUS and -G RAILS (or -i INVENTORY to take them from its hosts)")
    t0 = time.monotonic_ns()
    plan = plan_ep_rings(experts, rails)
    t_plan = time.monotonic_ns()
    switch_plans = inventory_ep(plan, inv) if inv is not None else abstract_ep(plan)
    t_done = time.monotonic_ns()
    bound = full_coverage_bound(rails)
    low, high = plan.pair_links()
    shortfall = None
    if not plan.complete:
        shortfall = (
            f"E = {experts} is above G(2G+1) = {bound}: {rails} rings of {plan.domains} domains cover at "
            f"most {rails * plan.domains} of the {plan.total_pairs} domain pairs; this plan covers "
            f"{plan.covered_pairs} (a smaller EP group covers all; --partial accepts this plan)"
        )
    files = (
        _write_files(out_path, switch_plans, f"labctl plan ep-rings E={experts} G={rails}")
        if out_path and (plan.complete or partial)
        else []
    )
    if as_json:
        print(
            json.dumps(
                {
                    "plan": "ep-rings",
                    "experts": experts,
                    "rails": rails,
                    "domains": plan.domains,
                    "bound": bound,
                    "pairs": {
                        "covered": plan.covered_pairs,
                        "total": plan.total_pairs,
                        "complete": plan.complete,
                    },
                    "rails_used": plan.rails_used,
                    "pair_links": {"min": low, "max": high},
                    "rings": plan.rings.tolist(),
                    "new_pairs": plan.new_pairs.tolist(),
                    "switches": _switches_json(switch_plans),
                    "files": files,
                    "inventory": str(inventory) if inventory else None,
                    "plan_ns": t_plan - t0,
                    "total_ns": t_done - t0,
                },
                indent=2,
            )
        )
    else:
        share = 100 * plan.covered_pairs / plan.total_pairs if plan.total_pairs else 100.0
        _say(
            f"EP divergent rings: E = {experts} GPUs, G = {rails} rails, m = {plan.domains} domains "
            f"(all pairs coverable up to E = G(2G+1) = {bound})"
        )
        _say(
            f"domain pairs one optical hop apart: {plan.covered_pairs} of {plan.total_pairs} ({share:.1f}%), "
            f"by {plan.rails_used} of {rails} rails; each pair on {low}..{high} rails"
        )
        from rich.table import Table

        table = Table(title_justify="left", show_edge=False)
        for col in ("rail", "new pairs", "ring (domains in order)"):
            table.add_column(col)
        rows = []
        for r in range(rails):
            ring = [str(int(d)) for d in plan.rings[r]]
            text = " ".join(ring[:12]) + (" …" if len(ring) > 12 else "")
            rows.append([str(r), str(int(plan.new_pairs[r])), text])
        shown, more = _condensed(rows)
        for row in shown:
            table.add_row(*(escape(c) for c in row))
        out.print(table)
        if more:
            _say(f"… {more} more rails (--json lists all)")
        where = f"on {inventory}" if inventory else "on the plan's own switches"
        sizes = sorted({str(sp.space) for sp in switch_plans})
        _say(
            f"{where}: {len(switch_plans)} switch mapping(s) ({', '.join(sizes)}), each a valid matching; "
            f"planned in {(t_plan - t0) / 1e6:.1f} ms, laid out in {(t_done - t_plan) / 1e6:.1f} ms"
        )
        for f in files:
            _say(f"wrote {f['file']}: labctl ocs apply {f['file']} --switch {f['switch']}")
    if shortfall is not None and not partial:
        raise InputError(shortfall)


def register(app: typer.Typer) -> None:
    app.add_typer(plan_app, name="plan")
