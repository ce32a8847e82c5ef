"""Workload-static circuit plans: circuits set once per deployment, not per phase.

Pure functions, no I/O. `graphs` builds the host graphs of the decode paper (hypercube Q_d, folded cube,
block folds Q_n[a,b] = K_2^a □ K_2^b, Hamming products, circulants, rings); `metrics` measures them
(degree, diameter, pair coverage); `matchings` splits a graph into one matching per OCS under a
per-accelerator port budget; `layout` turns matchings into switch patches (a duplex link X↔Y is
X.tx→Y.rx and Y.tx→X.rx, as labctl.inventory.topology does), each validated as a matching on its switch; `ep`
plans Opus §4's expert-parallel divergent rings (one ring order per rail over the scale-up domains).
"""
