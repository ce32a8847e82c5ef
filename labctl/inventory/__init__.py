"""What a lab is, validated before anything moves: the inventory file (`schema`: switches, hosts, GPUs,
NIC ports and their fibers, broker, power meters), config building blocks and secrets (`config`), port
mappings on a switch (`mapping`), circuits between hosts as patches on a rail's switch (`topology`), and
the delay profiles of modeled labs (`profiles`).
"""
