"""Host agents over MQTT: `labctl agent` runs one host's probes and streams their events to the controller.

Modules: wire.py (messages, topics, signing), broker.py (connection settings), clock.py (offsets),
agent.py (the agent: its commands in agent_commands.py, its mirror of the world in mirror.py), hub.py
(the controller's side: its broker connection, commands, event streams and clock exchange in
hub_connection.py, hub_commands.py, hub_streams.py, clock_exchange.py); the lab kind is
labctl/labs/agents.py.

Topics (`<lab>` and `<host>` from the inventory):
- `labctl/<lab>/<host>/events`  agent → controller: batches of events, QoS 1, one sequence number per
  batch plus the count of events before it, so lost batches *and* lost events are counted;
- `labctl/<lab>/<host>/cmd`     controller → agent: an allow-list of commands with validated arguments
  (`start`/`stop` named probes, `set_circuits`, `window` around a reconfiguration, `switched` when the
  switch acknowledged it, `ping` for the clock offset, `inspect` for `labctl lab check`: read-only); never
  a shell;
- `labctl/<lab>/<host>/reply`   agent → controller: one reply per command, naming the agent process; the
  reply to `stop` carries what the agent's probes did (run.json `probes.agent:<host>`: e.g. Rx-power
  samples/s per port) and how its world mirror kept up;
- `labctl/<lab>/<host>/status`  retained `online ID`, and `offline ID` as the agent's last will; ID names
  the agent process (its incarnation: random, pid, start time), so the controller tells a broker outage
  (the same process back) from a restart (a new one: this run's probes and unsent events died with the
  old one; decision 0024);
- `labctl/<lab>/_world`         controller → agents, simulated labs only: the switch's light and the NIC
  link transitions of the one behavioural model of the lab (decision 0017). Each switch change is
  announced `broker.feed_lead_ms` before its command goes out (decision 0041) and each light change is
  sent again when it happens; an agent's mirror runs `broker.mirror_lag_ms` behind the model, applies each
  change at its model time + lag, and its samplers read it at their own instants (decision 0046); a change
  that got there after the samplers passed its time is applied at once and counted late.
The controller hands every message to its client as soon as it is queued (no waiting for the previous
ones' PUBACKs) and, when it stops, waits until the broker has acknowledged them all; an agent told to stop
(SIGTERM) stops its probes, publishes what they sampled and its replies in flight, then says `offline`.
Every payload is `MAC STAMP BODY`: MAC is HMAC-SHA256 over topic, stamp and body with the key of the
host whose topic it is (per-host identities, decision 0067; the world feed carries one MAC per host) or the
inventory's shared `broker.auth_key` (`-` without a key); STAMP names the signer and a counter that only
grows. Messages that do not decode or validate are *malformed*; a bad MAC, an unknown host, or a batch
carrying events of another host's ports are *unauthorised*; a stamp seen before is *replayed*; a valid
signature by another host than the topic's is *forged*; all are dropped and counted, never acted on. With
per-host identities the broker's ACL (`labctl lab broker-config`) already refuses most of these.

Clock (decision 0040): the controller exchanges timestamped ping/pongs with each agent over the broker, a
burst every `clock_sync_interval_s` while its probes run, keeps the fastest of each burst and fits offset
and drift over the run (bound: |residual| + RTT/2 at the kept samples, if each leg took ≥ 0). An agent on
the controller's own kernel (same boot id and time namespace, clock unmodified) is recognised as sharing
its clock (offset 0 exactly); where both hosts' clocks are disciplined to one reference (chrony, ptp4l)
the daemons' bounds give a third estimate. The tightest sound source moves the agent's stamps onto the run
timebase (an event's `t_ns` and the times in its meta: `wire.STAMP_META`); run.json `clock_offsets` says
which source it was, the exchange-based estimate beside it, and every burst.
"""
