"""Emulated hardware: protocol emulators of switches (one shared core, a thin front end per protocol) and
the kernel-real fabric. They serve over real sockets and kernel objects, never shortcuts in-process."""
