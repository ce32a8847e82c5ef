"""The switch side: the `OpticalSwitch` capability and apply-with-verify (`protocol`), the switch-driver
registry entries (`switches`), and one package per protocol under `drivers/` (transport -> codec ->
driver). The drivers import nothing of the probes, lab kinds, agents, samplers or the run.
"""
