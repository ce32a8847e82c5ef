"""Behaviour models: the switch (mirrors, light), the NIC side of a lab (light, firmware, carrier,
transport), the transceiver EEPROM, and the probes that read the model directly. Emulators and the
simulated lab are built on these; nothing here opens a socket."""
