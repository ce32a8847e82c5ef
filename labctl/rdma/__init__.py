"""RDMA: the InfiniBand RC transport's reliability rules as a sans-IO model (labctl.rdma.rc), which the
emulated fabric carries over real UDP datagrams and the simulated lab runs as a model; pyverbs for real
RoCE/IB ports behind a small compatibility module (labctl.rdma.compat)."""
