"""How many nodes a local Deployment Engine can hold on this machine, from its TOTAL memory.

Every node of a round runs at once (the SuperLink hands all of them their message together),
and a node is three processes then: its `flower-supernode`, the `flower-superexec` the
SuperNode starts, and the `flwr-clientapp` process the superexec starts for the message (one a
message, Flower 1.42's design; it imports JAX, Flower and fl_privacy and rebuilds the node's
model and data). Besides the nodes: the SuperLink, its superexec, the ServerApp process, the
`flwr` CLI calls and the driver (`python -m experiments.flower_audit`) itself.

The constants are peak proportional set sizes (PSS: shared pages split among the processes
sharing them, so that a sum is what the processes take together), measured on 2026-12-07
with `smaps_rollup` every 0.3 s over a 4-node FedMIA smoke deployment (docs/experiments/
flower_audit.md, "Sizes"); resident sizes (RSS, shared pages counted in every process) in
brackets. With more nodes the shared pages are split among more processes, so a node's share
only falls.

The bound is computed from `total_memory()` (the machine's MemTotal, or a cgroup's limit if
lower), never from the memory free at the moment: one config, one verdict, whether the
machine is busy or idle. A busy machine may then not have the memory the bound allows: the
bound says what this machine holds, not what is free now.
"""

from __future__ import annotations

import os

MB = 1 << 20
SUPERNODE_BYTES = 98 * MB       # flower-supernode (139 MB RSS)
SUPEREXEC_BYTES = 91 * MB       # its flower-superexec (128 MB RSS)
CLIENTAPP_BYTES = 503 * MB      # a flwr-clientapp at its peak (680 MB RSS)
NODE_BYTES = SUPERNODE_BYTES + SUPEREXEC_BYTES + CLIENTAPP_BYTES
# The SuperLink (104 MB; 144 RSS), its superexec (91), the ServerApp process (365; 533 RSS),
# the `flwr run` / `flwr ls` calls (190 + 68) and the driver (about 1.4 GB RSS measured for
# `python -m experiments.flower_audit`).
BASE_BYTES = (104 + 91 + 365 + 190 + 68 + 1400) * MB
# The share of the total memory the deployment may take (the kernel, its page cache and
# everything else keep the rest).
FRACTION = 0.8


def total_memory() -> int:
  """This machine's memory in bytes: MemTotal, or the cgroup (v2 or v1) limit where lower."""
  total = os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')
  try:
    with open('/proc/meminfo', encoding='utf-8') as f:
      for line in f:
        if line.startswith('MemTotal:'):
          total = int(line.split()[1]) * 1024
  except OSError:
    pass
  for path in ('/sys/fs/cgroup/memory.max', '/sys/fs/cgroup/memory/memory.limit_in_bytes'):
    try:
      with open(path, encoding='utf-8') as f:
        text = f.read().strip()
    except OSError:
      continue
    if text.isdigit():
      total = min(total, int(text))
  return int(total)


def max_deployment_nodes(total: int | None = None) -> int:
  """The most nodes a local deployment holds on a machine of `total` bytes (default
  `total_memory()`): (FRACTION x total - BASE_BYTES) // NODE_BYTES, at least 1."""
  if total is None:
    total = total_memory()
  return max(1, int((FRACTION * int(total) - BASE_BYTES) // NODE_BYTES))
