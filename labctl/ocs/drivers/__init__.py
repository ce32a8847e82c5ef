"""OCS drivers, one module per protocol. Each satisfies `labctl.ocs.protocol.OpticalSwitch`."""
