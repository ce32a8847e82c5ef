"""Probes, one module per signal: async sources of `labctl.core.events.Event`s (labctl.probes.sampling.Probe).

`base` is what a probe is built from and registered as (`PortSite`, `ProbeContext`, `ProbeKind`,
`probe_kinds`); `sampling` the machinery samplers share (bounded queues, absolute tick schedules, report
gates, the experiment's `probes:` settings); `transceiver` decodes module EEPROMs. One module per signal:
carrier, rx_power, traffic, rdma, verbs_rc, linkstate, switch_power, power_meter, and `model` for the
probes that read a lab's behaviour model. This package file imports nothing.
"""
