"""The only road between the ranks of a graded job: a process-group backend whose every
message and collective goes through a relay in the judge's process.

Why: what the judge weighs about HOW an answer was computed (which messages, between whom,
how big, what they carried; which collectives) must be seen from somewhere no student process
can reach. Each rank of a relayed job runs in a sandbox of its own (its own network, mount,
IPC and PID namespaces, nothing shared on disk or in memory), so the socket the judge handed
it is the one way it can reach another rank. The relay, a thread of the judge, carries every
message, computes every collective itself, records each one (rank, operation, peer, bytes, a
digest of the content) and refuses what the check forbids (a ready-made collective in an
exercise built from send and recv). The judge reads the relay's record, never the rank's.

Rank side: `join(fd, rank, world)` registers the backend "relay" and makes it the default
process group; `dist.*` calls, `new_group`, DDP's hooks and torch's functional collectives all
reach RelayGroup's methods. Each rank also gets from the relay a secret of its own, from
which the worker builds its inputs: no rank can compute another's, so the numbers must
travel.

Wire: the grader's frames (ddpcourse/course/frames.py), each a dict of data, bounded.
"""

from __future__ import annotations

import hashlib
import secrets
import socket
import threading
from collections import defaultdict, deque
from datetime import timedelta

import torch
import torch.distributed as dist

from ddpcourse.course import frames

REDUCE_NAMES = {dist.ReduceOp.SUM: "sum", dist.ReduceOp.PRODUCT: "product",
                dist.ReduceOp.MIN: "min", dist.ReduceOp.MAX: "max",
                dist.ReduceOp.BAND: "band", dist.ReduceOp.BOR: "bor",
                dist.ReduceOp.BXOR: "bxor", dist.ReduceOp.AVG: "avg"}
DTYPES = {str(d): d for d in (torch.float32, torch.float64, torch.float16, torch.bfloat16,
                               torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8,
                               torch.bool, torch.complex64, torch.complex128)}
COLLECTIVES = ("allreduce", "broadcast", "allgather", "allgather_base", "reduce_scatter",
               "reduce_scatter_base", "alltoall", "alltoall_base", "gather", "scatter",
               "reduce", "barrier")


# --- frames --------------------------------------------------------------------------------

def write_frame(sock: socket.socket, obj, lock: threading.Lock | None = None) -> None:
    data = frames.encode(obj)
    if lock is None:
        sock.sendall(data)
    else:
        with lock:
            sock.sendall(data)


def read_exactly(sock: socket.socket, n: int) -> bytes:
    chunks = []
    while n:
        chunk = sock.recv(min(n, 1 << 20))
        if not chunk:
            raise EOFError("the other end closed the connection")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def read_frame(sock: socket.socket):
    return frames.read_frame(lambda n: read_exactly(sock, n))


def digest(tensor: torch.Tensor) -> str:
    return hashlib.sha256(tensor.detach().contiguous().view(torch.uint8).numpy()
                          .tobytes()).hexdigest()[:16] if tensor.numel() else "empty"


# --- the rank's side -----------------------------------------------------------------------

class Connection:
    """The rank's socket to the relay: requests out, replies matched by id."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.write_lock = threading.Lock()
        self.read_lock = threading.Lock()
        self.replies: dict[int, dict] = {}
        self.next_id = 0

    def request(self, message: dict) -> int:
        with self.write_lock:
            self.next_id += 1
            ident = self.next_id
            write_frame(self.sock, dict(message, id=ident))
        return ident

    def wait(self, ident: int, timeout: float | None) -> dict:
        while ident not in self.replies:
            with self.read_lock:
                if ident in self.replies:
                    break
                self.sock.settimeout(timeout)
                try:
                    got = read_frame(self.sock)
                except TimeoutError:
                    raise RuntimeError(f"the relay sent no answer in {timeout:g} s (a peer "
                                       "that never sent, or a collective some rank never "
                                       "called)") from None
                self.replies[got["id"]] = got
        reply = self.replies.pop(ident)
        if "error" in reply:
            raise RuntimeError(reply["error"])
        return reply

    def call(self, message: dict, timeout: float | None = None) -> dict:
        return self.wait(self.request(message), timeout)


class RelayWork(dist.Work):
    """A request the relay answers later; wait() blocks until it has, then fills the
    outputs."""

    def __init__(self, connection: Connection | None, ident: int = 0, outputs=(),
                 timeout: float = 0):
        super().__init__()
        self.connection, self.ident, self.outputs, self.seconds = \
            connection, ident, outputs, timeout
        self.source = -1
        self.done = connection is None  # None: nothing to wait for (a send, buffered)
        self.lock = threading.Lock()  # wait() and a future's thread: one reads the answer

    def wait(self, timeout=None):
        asked = timeout.total_seconds() if isinstance(timeout, timedelta) else 0
        self._complete(min(asked, self.seconds) if asked > 0 else self.seconds)
        return True

    def _complete(self, seconds: float) -> None:
        with self.lock:
            if not self.done:
                reply = self.connection.wait(self.ident, seconds)
                for out, got in zip(self.outputs, reply.get("tensors", []), strict=False):
                    out.copy_(got)
                self.source = reply.get("from", -1)
                self.done = True

    def is_completed(self):
        return self.done

    def get_future(self):
        """A future done when the relay answers (DDP's reducer and communication hooks chain
        on it), completed by a thread of its own, so that asking for it waits for nothing."""
        future = torch.futures.Future()

        def complete():
            try:
                self._complete(self.seconds)
                future.set_result(list(self.outputs))
            except Exception as error:  # noqa: BLE001  the relay's refusal, a rank gone
                future.set_exception(error)
        if self.done:
            complete()
        else:
            threading.Thread(target=complete, daemon=True).start()
        return future

    def _source_rank(self):
        return self.source

    def source_rank(self):
        return self.source


def reduce_name(opts) -> str:
    op = getattr(opts, "reduceOp", dist.ReduceOp.SUM)
    name = REDUCE_NAMES.get(getattr(op, "op", op))
    if name is None:
        raise ValueError(f"the relay does not reduce with {op}")
    return name


def flat(tensors) -> list[torch.Tensor]:
    out = []
    for t in tensors:
        out.extend(flat(t) if isinstance(t, (list, tuple)) else [t])
    return out


class RelayGroup(dist.ProcessGroup):
    """A process group whose every operation is a request to the relay."""

    def __init__(self, connection: Connection, group: str, rank: int, size: int,
                 timeout: timedelta):
        super().__init__(rank, size)
        self.connection, self.group, self.name = connection, group, group
        self.seconds = timeout.total_seconds()

    def getBackendName(self):
        return "relay"

    # torch keeps a group's name in its backends, which a group that is its own backend has
    # none of (DeviceMesh asks for it): kept here instead.
    def _set_group_name(self, name):
        self.name = name

    @property
    def group_name(self):
        return self.name

    supports_coalescing = False  # batch_isend_irecv: one request per operation

    def _get_backend(self, device):
        return self  # the group is its own backend, on every device

    def _collective(self, name: str, inputs, outputs, **options):
        ident = self.connection.request({"op": "collective", "group": self.group,
                                         "name": name, "tensors": [t.detach().cpu() for t
                                                                   in flat(inputs)],
                                         **options})
        return RelayWork(self.connection, ident, flat(outputs), self.seconds)

    # point to point
    def send(self, tensors, dst, tag=0):
        self.connection.request({"op": "send", "group": self.group, "to": dst, "tag": tag,
                                 "tensor": tensors[0].detach().cpu()})
        return RelayWork(None)

    def recv(self, tensors, src, tag=0):
        ident = self.connection.request({"op": "recv", "group": self.group, "from": src,
                                         "tag": tag, "numel": tensors[0].numel(),
                                         "dtype": str(tensors[0].dtype)})
        return RelayWork(self.connection, ident, [tensors[0]], self.seconds)

    def recv_anysource(self, tensors, tag=0):
        return self.recv(tensors, None, tag)

    # collectives (the relay computes them in group-rank order)
    def allreduce(self, tensors, opts=None):
        return self._collective("allreduce", tensors, tensors, reduce=reduce_name(opts))

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors, opts):
        return self._collective("broadcast", tensors, tensors, root=opts.rootRank)

    def allgather(self, output_lists, inputs, opts=None):
        return self._collective("allgather", inputs, output_lists)

    def _allgather_base(self, output, input, opts=None):
        return self._collective("allgather_base", [input], [output])

    def all_gather_single(self, output, input, opts=None):
        return self._allgather_base(output, input, opts)

    def reduce_scatter(self, outputs, input_lists, opts=None):
        return self._collective("reduce_scatter", input_lists, outputs,
                                reduce=reduce_name(opts))

    def _reduce_scatter_base(self, output, input, opts=None):
        return self._collective("reduce_scatter_base", [input], [output],
                                reduce=reduce_name(opts))

    def reduce_scatter_single(self, output, input, opts=None):
        return self._reduce_scatter_base(output, input, opts)

    def alltoall_base(self, output, input, output_splits, input_splits, opts=None):
        return self._collective("alltoall_base", [input], [output],
                                input_splits=list(input_splits or []))

    def all_to_all_single(self, output, input, output_splits, input_splits, opts=None):
        return self.alltoall_base(output, input, output_splits, input_splits, opts)

    def alltoall(self, outputs, inputs, opts=None):
        return self._collective("alltoall", inputs, outputs)

    def gather(self, output_lists, inputs, opts):
        return self._collective("gather", inputs, output_lists, root=opts.rootRank)

    def scatter(self, outputs, input_lists, opts):
        return self._collective("scatter", input_lists, outputs, root=opts.rootRank)

    def reduce(self, tensors, opts):
        return self._collective("reduce", tensors, tensors, root=opts.rootRank,
                                reduce=reduce_name(opts))

    def barrier(self, opts=None):
        return self._collective("barrier", [], [])


_connection: Connection | None = None


def create_group(options, backend_options=None):
    ranks = list(options.global_ranks_in_group) or list(range(options.group_size))
    _connection.call({"op": "group", "group": options.group_id, "ranks": ranks,
                      "timeout": options.timeout.total_seconds()},
                     timeout=options.timeout.total_seconds())
    return RelayGroup(_connection, options.group_id, options.group_rank, options.group_size,
                      options.timeout)


def join(fd: int, rank: int, world: int, timeout: timedelta) -> dict:
    """As a relayed job's rank starts (before any of the submission's code runs): the default
    process group is the relay's. Returns the relay's greeting ({"secret": ...})."""
    global _connection
    _connection = Connection(socket.socket(fileno=fd))
    hello = _connection.call({"op": "hello"}, timeout=timeout.total_seconds())
    dist.Backend.register_backend("relay", create_group, extended_api=True, devices=["cpu"])
    # The group needs no store: the relay is the rendezvous. A store of this process alone
    # satisfies init_process_group (torch's store barrier after init is off by default).
    dist.init_process_group("relay", store=dist.HashStore(), rank=rank, world_size=world,
                            timeout=timeout)
    return hello


def note(**fields) -> None:
    """Something the rank's harness tells the relay (a case begins, what a check returned)."""
    _connection.call({"op": "note", **fields}, timeout=60)


# --- the judge's side ----------------------------------------------------------------------

REDUCERS = {"sum": torch.add, "product": torch.mul, "min": torch.minimum,
            "max": torch.maximum, "band": torch.bitwise_and, "bor": torch.bitwise_or,
            "bxor": torch.bitwise_xor}


def reduced(tensors: list[torch.Tensor], how: str) -> torch.Tensor:
    if how == "avg":
        return reduced(tensors, "sum") / len(tensors)
    out = tensors[0].clone()
    for t in tensors[1:]:
        out = REDUCERS[how](out, t)
    return out


def compute(name: str, inputs: list[list[torch.Tensor]], options: list[dict]) -> list[list]:
    """Each member's outputs of collective `name`, from every member's inputs (group order)."""
    size = len(inputs)
    first = options[0]
    if name == "barrier":
        return [[] for _ in range(size)]
    if name == "allreduce":
        return [[reduced([inputs[r][i] for r in range(size)], first["reduce"])
                 for i in range(len(inputs[0]))]] * size
    if name == "broadcast":
        return [list(inputs[first["root"]])] * size
    if name == "reduce":
        out = [reduced([inputs[r][i] for r in range(size)], first["reduce"])
               for i in range(len(inputs[0]))]
        return [out if r == first["root"] else list(inputs[r]) for r in range(size)]
    if name == "allgather":
        return [[inputs[r][0] for r in range(size)]] * size
    if name == "allgather_base":
        return [[torch.cat([inputs[r][0].reshape(-1) for r in range(size)])]] * size
    if name == "gather":
        return [[inputs[r][0] for r in range(size)] if me == first["root"] else []
                for me in range(size)]
    if name == "scatter":
        return [[inputs[first["root"]][me]] for me in range(size)]
    if name == "reduce_scatter":
        return [[reduced([inputs[r][me] for r in range(size)], first["reduce"])]
                for me in range(size)]
    if name == "reduce_scatter_base":
        chunks = [inputs[r][0].reshape(-1).chunk(size) for r in range(size)]
        return [[reduced([chunks[r][me] for r in range(size)], first["reduce"])]
                for me in range(size)]
    if name == "alltoall":
        return [[inputs[r][me] for r in range(size)] for me in range(size)]
    if name == "alltoall_base":
        parts = []
        for r in range(size):
            splits = options[r]["input_splits"] or [inputs[r][0].shape[0] // size] * size
            parts.append(inputs[r][0].split(splits))
        return [[torch.cat([parts[r][me] for r in range(size)])] for me in range(size)]
    raise ValueError(f"the relay does not carry {name}")


class Relay:
    """The judge's end of a relayed job of `world` ranks: start() it, hand rank r the socket
    rank_end(r), then wait(); `record[r]` is every operation rank r asked for, in order,
    `notes[r]` what its harness told, `secrets[r]` its secret. With refuse_collectives, every
    collective except a barrier is refused (and recorded as refused)."""

    def __init__(self, world: int, refuse_collectives: bool = False):
        self.world = world
        self.refuse_collectives = refuse_collectives
        self.secrets = [secrets.randbits(62) for _ in range(world)]
        self.record: list[list[dict]] = [[] for _ in range(world)]
        self.notes: list[list[dict]] = [[] for _ in range(world)]
        self.ended: list[str | None] = [None] * world
        self.lock = threading.Lock()
        self.groups: dict[str, list[int]] = {}
        self.sequence: dict[tuple[str, int], int] = defaultdict(int)
        self.pending: dict[tuple[str, int], dict[int, tuple]] = {}
        self.mailbox: dict[tuple, deque] = defaultdict(deque)  # (group, src, dst, tag)
        self.waiting: list[tuple] = []  # recvs not yet matched
        self.case = [None] * world
        pairs = [socket.socketpair() for _ in range(world)]
        self.ours = [a for a, _ in pairs]
        self.theirs = [b for _, b in pairs]
        self.write_locks = [threading.Lock() for _ in range(world)]
        self.threads = [threading.Thread(target=self.serve, args=(r,), daemon=True)
                        for r in range(world)]

    def rank_end(self, rank: int) -> int:
        return self.theirs[rank].fileno()

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def close_rank_ends(self) -> None:
        """Once every rank holds its end: the relay's copies go, so a rank's death is seen."""
        for s in self.theirs:
            s.close()

    def close(self) -> None:
        for s in self.ours:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    # --- serving ---------------------------------------------------------------------------

    def reply(self, rank: int, message: dict) -> None:
        try:
            write_frame(self.ours[rank], message, self.write_locks[rank])
        except OSError:
            pass  # that rank is gone; its end is noted by its own thread

    def serve(self, rank: int) -> None:
        sock = self.ours[rank]
        try:
            while True:
                request = read_frame(sock)
                if not isinstance(request, dict) or not isinstance(request.get("id"), int):
                    raise ValueError("a request the relay cannot read")
                with self.lock:
                    self.handle(rank, request)
        except (EOFError, ConnectionError):
            why = "ended"
        except Exception as error:  # noqa: BLE001  a rank's bytes: anything can be wrong
            why = f"sent what the relay cannot read ({type(error).__name__}: {error})"[:300]
        with self.lock:
            self.ended[rank] = why
            self.fail_waiting_on(rank)

    def event(self, rank: int, **fields) -> None:
        self.record[rank].append(dict(fields, case=self.case[rank]))

    def handle(self, rank: int, request: dict) -> None:
        op, ident = request.get("op"), request["id"]
        if op == "hello":
            self.reply(rank, {"id": ident, "secret": self.secrets[rank]})
        elif op == "note":
            fields = {k: v for k, v in request.items() if k not in ("op", "id")}
            if "case" in fields:
                self.case[rank] = fields["case"]
            self.notes[rank].append(fields)
            self.reply(rank, {"id": ident})
        elif op == "group":
            ranks = [int(r) for r in request["ranks"]]
            known = self.groups.setdefault(str(request["group"]), ranks)
            if known != ranks or rank not in ranks or \
                    any(not 0 <= r < self.world for r in ranks):
                self.reply(rank, {"id": ident, "error": (
                    f"group {request['group']}: rank {rank} made it of ranks {ranks}, another "
                    f"rank of {known}: every process must create every group (dist.new_group), "
                    "in the same order, members or not")})
                return
            self.event(rank, kind="group", group=str(request["group"]), ranks=tuple(ranks),
                       timeout=float(request.get("timeout") or 0))
            self.reply(rank, {"id": ident})
        elif op == "send":
            self.send(rank, request)
        elif op == "recv":
            self.recv(rank, request)
        elif op == "collective":
            self.collective(rank, request)
        else:
            self.reply(rank, {"id": ident, "error": f"unknown request {op!r}"})
        if op in ("recv", "collective"):  # waiting on a rank that has ended already
            for gone, why in enumerate(self.ended):
                if why is not None:
                    self.fail_waiting_on(gone)

    def members(self, group: str) -> list[int]:
        if group not in self.groups:
            raise ValueError(f"no group {group!r}")
        return self.groups[group]

    def send(self, rank: int, request: dict) -> None:
        group, tensor = str(request["group"]), request["tensor"]
        members = self.members(group)
        dst = members[int(request["to"])]
        self.event(rank, kind="send", peer=dst, numel=tensor.numel(),
                   nbytes=tensor.numel() * tensor.element_size(), digest=digest(tensor))
        self.mailbox[(group, rank, dst, int(request["tag"]))].append(tensor)
        self.match()

    def recv(self, rank: int, request: dict) -> None:
        group = str(request["group"])
        members = self.members(group)
        src = None if request["from"] is None else members[int(request["from"])]
        numel, dtype = int(request["numel"]), DTYPES.get(request["dtype"])
        if dtype is None:
            self.reply(rank, {"id": request["id"], "error": f"a receive of {request['dtype']}"})
            return
        event = dict(kind="recv", peer=src, numel=numel, nbytes=numel * dtype.itemsize,
                     case=self.case[rank])
        self.record[rank].append(event)
        self.waiting.append((rank, request, group, src, event))
        self.match()

    def match(self) -> None:
        still = []
        for rank, request, group, src, event in self.waiting:
            for s in [src] if src is not None else self.members(group):
                box = self.mailbox.get((group, s, rank, int(request["tag"])))
                if box:
                    tensor = box.popleft()
                    event.update(got_from=s, digest=digest(tensor))
                    if tensor.numel() != event["numel"]:
                        self.reply(rank, {"id": request["id"], "error": (
                            f"rank {rank} posted a receive of {event['numel']} elements; "
                            f"rank {s} sent {tensor.numel()}")})
                    else:
                        self.reply(rank, {"id": request["id"], "tensors": [tensor],
                                          "from": self.members(group).index(s)})
                    break
            else:
                still.append((rank, request, group, src, event))
        self.waiting = still

    def collective(self, rank: int, request: dict) -> None:
        group, name = str(request["group"]), request["name"]
        members = self.members(group)
        tensors = list(request["tensors"])
        numel = sum(t.numel() for t in tensors)
        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        if name not in COLLECTIVES:
            self.reply(rank, {"id": request["id"], "error": f"unknown collective {name!r}"})
            return
        if self.refuse_collectives and name != "barrier":
            self.event(rank, kind="refused", op=name, numel=numel, nbytes=nbytes,
                       ranks=tuple(members))
            self.reply(rank, {"id": request["id"], "error": (
                f"a ready-made collective ({name}) was called: build this one from send/recv")})
            return
        self.event(rank, kind="collective", op=name, numel=numel, nbytes=nbytes,
                   ranks=tuple(members), group=group)
        key = (group, rank)
        seq = self.sequence[key]
        self.sequence[key] += 1
        entry = self.pending.setdefault((group, seq), {})
        entry[rank] = (name, tensors, request)
        if len(entry) < len(members):
            return
        del self.pending[(group, seq)]
        names = {entry[r][0] for r in members}
        if len(names) != 1:
            for r in members:
                self.reply(r, {"id": entry[r][2]["id"], "error": (
                    f"the ranks of group {members} called different collectives at once: "
                    + ", ".join(f"rank {m}: {entry[m][0]}" for m in members))})
            return
        options = [entry[r][2] for r in members]
        try:
            outputs = compute(name, [entry[r][1] for r in members], options)
        except Exception as error:  # noqa: BLE001  shapes the ranks disagree on
            for r in members:
                self.reply(r, {"id": entry[r][2]["id"], "error": (
                    f"{name} over ranks {members} could not be computed: {error}")[:300]})
            return
        for i, r in enumerate(members):
            self.reply(r, {"id": entry[r][2]["id"], "tensors": outputs[i]})

    def fail_waiting_on(self, gone: int) -> None:
        """Every receive from the rank that ended, and every collective it was part of, fails
        now instead of waiting out its timeout."""
        still = []
        for waiting in self.waiting:
            rank, request, group, src, _ = waiting
            if src == gone or (src is None and self.members(group) == [rank, gone]):
                self.reply(rank, {"id": request["id"], "error": f"rank {gone} ended"})
            else:
                still.append(waiting)
        self.waiting = still
        for key, entry in list(self.pending.items()):
            if gone in self.members(key[0]):
                for r, (_, _, request) in entry.items():
                    self.reply(r, {"id": request["id"], "error": f"rank {gone} ended"})
                del self.pending[key]
