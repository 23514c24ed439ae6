"""Where the tensor-parallel ranks run and how rank 0 reaches them: SGLang's ``--tp-size``,
``--nnodes``, ``--node-rank``, ``--dist-init-addr`` and ``--dist-timeout``.

Layout: the ranks are spread evenly over the nodes, node k holding ranks [k*R, (k+1)*R) with
R = tp_size / nnodes, rank r on its node's ``cuda:{base + r % R}``. Worked example, tp 4 over 2
nodes: node 0 runs rank 0 (the ``Engine``, which serves HTTP) and rank 1; node 1 (``specdec serve
--node-rank 1``) runs ranks 2 and 3 and serves nothing.

Two channels, both at node 0's address (``--dist-init-addr HOST:PORT``; on one node 127.0.0.1
with free ports):

    HOST:PORT     torch.distributed's store: the process group (gloo on CPU, NCCL on CUDA) that
                  carries the tensors
    HOST:PORT+1   the control channel: one authenticated TCP connection (multiprocessing.connection)
                  from every rank to rank 0; rank 0's scheduler calls go out on it, a rank's ready
                  and its traceback come back. It is the same for a local process and a rank on
                  another node, and a connection that closes is a rank that is gone.

Joining: each rank connects (retrying until ``--dist-timeout``) and says hello with its rank and
flags; once every rank has, rank 0 answers each "welcome" (or "reject" with the reason: flags that
differ from node 0's, a node that never joined) and all of them create the process group.
"""

from __future__ import annotations

import dataclasses
import datetime
import multiprocessing.connection
import os
import socket
import time
from typing import Any

import torch

from specdec.models.parallel import TPGroup

__all__ = ["Topology", "TPJoinError", "rank_device", "init_distributed", "connect", "listen", "accept"]

COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=600)
# the control channel's shared secret across nodes; one node uses a random one
AUTHKEY_ENV = "SPECDEC_DIST_AUTHKEY"
_RETRY_S = 0.2


class TPJoinError(RuntimeError):
    """A rank could not join its tensor-parallel group (nobody answered, a node never came, flags differ)."""


@dataclasses.dataclass(frozen=True)
class Topology:
    """The tensor-parallel ranks over the nodes, and node 0's addresses."""

    tp_size: int
    nnodes: int
    host: str
    store_port: int  # torch.distributed's store
    control_port: int  # rank 0's control listener
    authkey: bytes = dataclasses.field(repr=False)
    join_timeout: float

    @classmethod
    def of(cls, args: Any) -> "Topology":
        """From ``EngineArgs``: node 0's ``--dist-init-addr``, or free local ports on one node."""
        if args.dist_init_addr is None:
            return cls(args.tp_size, args.nnodes, "127.0.0.1", _free_port(), _free_port(), os.urandom(16),
                       float(args.dist_timeout))
        host, _, port = args.dist_init_addr.rpartition(":")
        key = os.environ.get(AUTHKEY_ENV, "specdec").encode()
        return cls(args.tp_size, args.nnodes, host.strip("[]"), int(port), int(port) + 1, key,
                   float(args.dist_timeout))

    @property
    def ranks_per_node(self) -> int:
        return self.tp_size // self.nnodes

    def node_ranks(self, node: int) -> range:
        return range(node * self.ranks_per_node, (node + 1) * self.ranks_per_node)

    def node_of(self, rank: int) -> int:
        return rank // self.ranks_per_node

    def local_rank(self, rank: int) -> int:
        return rank % self.ranks_per_node


def rank_device(device: str, local_rank: int) -> str:
    """A rank's device: ``cuda:{base + local_rank}`` on CUDA, the same CPU otherwise."""
    if not str(device).startswith("cuda"):
        return device
    base = int(str(device).partition(":")[2] or 0)
    return f"cuda:{base + local_rank}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def init_distributed(rank: int, topo: Topology, device: str, *, custom_all_reduce: bool = True) -> TPGroup:
    """Join the process group; its all-reduce is the one-shot path over peer memory for small messages
    where every rank can run it (``custom_all_reduce``: not --disable-custom-all-reduce; one host,
    CUDA), NCCL's (gloo's on CPU) otherwise (``specdec.models.all_reduce``)."""
    import torch.distributed as dist

    from specdec.models.all_reduce import choose_all_reduce

    nccl = str(device).startswith("cuda")
    if nccl:
        torch.cuda.set_device(torch.device(device))
    dist.init_process_group("nccl" if nccl else "gloo", init_method=f"tcp://{_url_host(topo.host)}:{topo.store_port}",
                            rank=rank, world_size=topo.tp_size, timeout=COLLECTIVE_TIMEOUT)
    if nccl:  # NOTE: create the communicator now, eagerly: CUDA-graph capture cannot
        dist.all_reduce(torch.zeros(1, device=device))
    base = torch.device(device).index - topo.local_rank(rank) if nccl else 0  # this node's first rank's GPU
    reducer = choose_all_reduce(None, device, size=topo.tp_size, enabled=custom_all_reduce,
                                single_host=topo.nnodes == 1, peers=[base + r for r in range(topo.ranks_per_node)])
    return TPGroup(rank=rank, size=topo.tp_size, reducer=reducer)


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


# ---------------------------------------------------------------- a rank's side
def connect(topo: Topology, rank: int, args: Any) -> multiprocessing.connection.Connection:
    """Reach rank 0 (retrying until the join timeout), say hello, wait for its welcome."""
    deadline = time.monotonic() + topo.join_timeout
    where = f"{topo.host}:{topo.control_port}"
    while True:
        try:
            conn = multiprocessing.connection.Client((topo.host, topo.control_port), authkey=topo.authkey)
            break
        except OSError as e:  # not listening yet
            if time.monotonic() > deadline:
                raise TPJoinError(
                    f"tensor-parallel rank {rank} (node {topo.node_of(rank)}): node 0 did not answer at {where} "
                    f"within {topo.join_timeout:g} s (--dist-timeout): is `specdec serve ... --node-rank 0` running "
                    f"with the same --dist-init-addr?") from e
            time.sleep(_RETRY_S)
    conn.send(("hello", rank, args))
    if not conn.poll(max(deadline - time.monotonic(), 0.0) + topo.join_timeout):
        raise TPJoinError(f"tensor-parallel rank {rank}: node 0 did not welcome it within the join timeout")
    try:
        kind, payload = conn.recv()
    except EOFError as e:
        raise TPJoinError(f"tensor-parallel rank {rank}: node 0 closed the connection while it joined") from e
    if kind != "welcome":
        raise TPJoinError(f"tensor-parallel rank {rank}: node 0 refused it: {payload}")
    return conn


# ---------------------------------------------------------------- rank 0's side
def listen(topo: Topology) -> socket.socket:
    """Rank 0's control listener (bound before any rank is started, so none finds it missing)."""
    server = socket.create_server((topo.host, topo.control_port), reuse_port=False,
                                  family=socket.AF_INET6 if ":" in topo.host else socket.AF_INET)
    server.settimeout(_RETRY_S)
    return server


def accept(server: socket.socket, authkey: bytes) -> tuple[int, Any, multiprocessing.connection.Connection] | None:
    """One rank's hello (rank, its flags) within ``_RETRY_S``, or None; the connection authenticated
    as ``multiprocessing.connection.Listener`` would."""
    try:
        sock, _ = server.accept()
    except TimeoutError:
        return None
    sock.setblocking(True)
    conn = multiprocessing.connection.Connection(sock.detach())
    try:
        multiprocessing.connection.deliver_challenge(conn, authkey)
        multiprocessing.connection.answer_challenge(conn, authkey)
        if not conn.poll(COLLECTIVE_TIMEOUT.total_seconds()):
            raise TPJoinError("a connection said nothing")
        kind, rank, args = conn.recv()
    except (OSError, EOFError, ValueError, TPJoinError, multiprocessing.AuthenticationError):
        conn.close()  # not one of ours (or it left at once): keep waiting for the ranks
        return None
    return int(rank), args, conn


def differing_flags(ours: Any, theirs: Any) -> list[str]:
    """The flags on which a rank's ``EngineArgs`` differ from rank 0's (``--node-rank`` aside)."""
    out = []
    for f in dataclasses.fields(ours):
        a, b = getattr(ours, f.name), getattr(theirs, f.name, None)
        if f.name != "node_rank" and a != b:
            out.append(f"--{f.name.replace('_', '-')} {b!r} (node 0: {a!r})")
    return out
