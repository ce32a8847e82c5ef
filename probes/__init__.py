"""Probes, one module per signal. Each is an async source of `labctl.events.Event`s (labctl.sampling.Probe)."""
