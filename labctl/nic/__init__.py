"""NIC link settings (auto-negotiation, speed/duplex/link modes, FEC, driver private flags): the values
`labctl tune` sweeps per port, and the capability a lab offers to read and apply them (settings.py)."""
