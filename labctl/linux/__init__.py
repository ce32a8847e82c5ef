"""Linux plumbing shared by the real probes and the emulated fabric: network namespaces, netlink
(rtnetlink, generic netlink/ethtool), timerfd. Nothing here knows about labs, switches or events."""
