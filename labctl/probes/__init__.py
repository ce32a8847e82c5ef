"""Probes, one module per signal: async sources of `labctl.events.Event`s (labctl.sampling.Probe)."""
