"""Communication for one plan version: a fresh world of the live workers only.

Every plan version gets its own process group, rendezvoused under a new store prefix
(`recycle/v{version}/`), with ranks renumbered over the live workers in (replica, stage)
order, so traffic of an aborted version can never reach the next one (docs/design.md section 6).
Inside a world:
  - p2p: activations and gradients between whichever workers the plan's routes name,
    tagged by (iteration parity, micro-batch, direction) so re-routed streams never mix;
  - one group per stage, of its live peers only, for the all-reduce of its gradients;
  - small control traffic (all-gather of ints, byte blobs for state transfer).
Every blocking call has a timeout: a SIGKILLed peer shows up as "connection closed" at
once, a hung one as a timeout, both as CommError, never as a hang. Before the gloo
rendezvous the members check in on the store (World._meet), watching for a newer plan:
gloo's own rendezvous blocks uninterruptibly for the whole timeout. The links: member_links.py.
On CUDA with one GPU per local worker: data over NCCL, control over gloo; with fewer GPUs
than workers everything goes through gloo with CPU copies (NCCL cannot share a device).
"""
from __future__ import annotations

import io
import os
import threading
from datetime import timedelta
from typing import Callable, Optional, Sequence

import torch
import torch.distributed as dist

from executor import protocol as P
from executor.runtime.transport.binding import LINK_DOWN
from executor.runtime.transport.member_links import MemberLinks
from executor.runtime.transport.waiting import CommError, WaitEnded, said, wait_until
from executor.runtime.transport.wire import Activation, ActivationSpec, ActivationSpecError, grad_message
from executor.timeouts import Timeouts

Worker = tuple[int, int]
FWD, BWD = 0, 1
_BLOB_TAG = 1 << 24


__all__ = ["World", "CommError", "WaitEnded"]


class World:
    """The process group of one plan version, seen from one worker."""

    def __init__(self, store: dist.Store, version: int, me: Worker, live: Sequence[Worker],
                 timeout_s: float, device: torch.device = torch.device("cpu"),
                 local_workers: Optional[int] = None, newer: Optional[Callable] = None,
                 missing: Optional[Callable[[list], None]] = None,
                 incarnations: Optional[dict] = None, poll_waits: Optional[bool] = None,
                 state_timeout_s: Optional[float] = None):
        self.version, self.me = version, me
        self._newer, self.incarnations = newer, incarnations
        self.workers = sorted(tuple(w) for w in live)
        self.rank_of = {w: i for i, w in enumerate(self.workers)}
        self.rank = self.rank_of[me]
        self.timeout = timedelta(seconds=timeout_s)
        # a blob of state (send_blob/recv_blob): Timeouts.state_io, the comm timeout if none
        self.state_timeout = timedelta(seconds=state_timeout_s or timeout_s)
        self.device = device
        n_local = local_workers or len(self.workers)
        # NCCL only where each local rank owns a GPU; else gloo sees CPU copies.
        self.nccl = device.type == "cuda" and torch.cuda.device_count() >= n_local
        # NCCL: a dead peer can leave a kernel waiting forever where gloo fails on the closed
        # socket, so waits poll for completion, a deadline and a plan that drops a member
        # (then the communicators are aborted, in close()). Tests run this path on gloo.
        self.poll_waits = self.nccl if poll_waits is None else poll_waits
        self._pending: list[tuple[dist.Work, torch.Tensor, Worker]] = []
        # Receives posted ahead of their action: (iteration, g, direction) -> (work, buffer).
        # gloo moves a message only once its receive is posted (a receive posted after the
        # data was sent waited 70-130 us more on loopback, one posted before it 6 us).
        self._early: dict[tuple[int, int, int], tuple[dist.Work, torch.Tensor]] = {}
        self.store = store
        self._specs: dict[int, ActivationSpec] = {}  # stage -> its output's agreed spec
        # Called when a receive is about to block: work the worker can do while it waits
        # (the stepper's copy for rollback); it must not communicate.
        self.on_idle: Optional[Callable[[], None]] = None
        self._links = MemberLinks(version, me, self.workers, timeout_s)  # probe and meter
        if newer is not None:
            self._meet(store, newer, missing or (lambda ws: None))
            # A version after the first follows a failure (or a change): before gloo's
            # rendezvous, which waits out its timeout on a cut link and says not where,
            # the members probe each other (binding.py; a few ms when all are reachable).
            down = self._links.down(store) if version > 0 else []
            if down:
                self.close()
                raise CommError(f"world v{version} rendezvous: {LINK_DOWN} to {down} (no "
                                "TCP connection to their address)", down[0])
        # Process groups are built directly, each under its own explicit store prefix, not
        # with init_process_group/new_group: those name groups by a process-wide counter
        # that advances even when a rendezvous fails partway, after which this process's
        # store keys no longer match its peers' and every later world times out.
        pre = P.world_prefix(version)
        try:
            self.ctrl = dist.ProcessGroupGloo(dist.PrefixStore(pre + "ctrl/", store),
                                              self.rank, len(self.workers), self.timeout)
            self.data = self._nccl(dist.PrefixStore(pre + "data/", store), self.rank,
                                   len(self.workers)) if self.nccl else self.ctrl
            # The stage's own group, built by its members only.
            peers = [w for w in self.workers if w[1] == me[1]]
            self.stage_size = len(peers)
            sub = dist.PrefixStore(f"{pre}stage{me[1]}/", store)
            self.stage_group = (self._nccl(sub, peers.index(me), len(peers)) if self.nccl else
                                dist.ProcessGroupGloo(sub, peers.index(me), len(peers), self.timeout))
        except Exception as exc:
            down = self._links.down(store)  # before close(): our own listener stays up
            self.close()
            if down:  # alive peers (checked in) that this worker cannot reach: say whom
                raise CommError(f"world v{version} rendezvous failed: {LINK_DOWN} to "
                                f"{down} (no TCP connection to their address); "
                                f"{said(exc)}", down[0]) from exc
            raise CommError(f"world v{version} rendezvous failed: {said(exc)}") from exc
        self._links.start_meter(store)

    def link_seconds_per_microbatch(self, microbatches: int) -> float:
        """What this worker's own link took per micro-batch since the last call to carry
        what it sent (link_meter.py; 0.0 where it has none)."""
        return self._links.seconds_per_microbatch(microbatches)

    def _nccl(self, store: dist.Store, rank: int, size: int):
        """One NCCL communicator, built now (not at the first collective) so that a failed
        init is a CommError of this version. Every collective and the init carry the comm
        timeout; errors are ours to handle (abort), never the watchdog's to kill the
        process: TORCH_NCCL_ASYNC_ERROR_HANDLING=3 (skip clean-up)."""
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3")
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = self.timeout
        try:  # non-blocking init: a peer that dies during ncclCommInitRank is a timeout
            opts.config.blocking = 0
        except AttributeError:  # older NCCL bindings: init blocks (members met just before)
            pass
        pg = dist.ProcessGroupNCCL(store, rank, size, opts)
        pg.eager_connect_single_device(self.device)
        return pg

    def _meet(self, store: dist.Store, newer: Callable, missing: Callable) -> None:
        """Wait until every member has checked in under this version, leaving for any
        newer plan (WaitEnded): a worker stuck in gloo's rendezvous of a version the others
        have left waits out the full timeout, and plans published meanwhile made workers
        chase each other through versions without ever meeting. While this version is
        still the newest, keep waiting (a stalled member may come back) but report the
        missing once (Timeouts.report_missing), so the plan source can declare them
        failed or re-publish."""
        keys = [P.checkin_key(self.version, w) for w in self.workers]
        mine = keys[self.rank]
        # checked in with where gloo listens: a failed rendezvous probes the links
        store.set(mine, self._links.checkin())
        absent = lambda: [w for w, k in zip(self.workers, keys) if not store.check([k])]  # noqa: E731
        try:
            wait_until(lambda: store.check(keys), f"world v{self.version} rendezvous",
                       limit_s=None, newer=newer, poll_s=0.02, max_poll_s=0.02,
                       late=(Timeouts(self.timeout.total_seconds()).report_missing,
                             lambda: missing(absent())))
        except WaitEnded:
            store.delete_key(mine)  # nobody should wait for us here any more
            self._links.close()
            raise

    # ---- p2p -------------------------------------------------------------------------
    def _tag(self, iteration: int, g: int, direction: int) -> int:
        return ((iteration % 2) * (1 << 20) + g) * 2 + direction

    def _wire(self, t: torch.Tensor) -> torch.Tensor:
        return t.contiguous() if self.nccl or t.device.type == "cpu" else t.cpu()

    def send(self, t: torch.Tensor, to: Worker, iteration: int, g: int, direction: int) -> None:
        """Non-blocking: the tensor is kept until flush() so a slow receiver never stalls
        the plan order (a blocking send could deadlock two workers that both send first)."""
        buf = self._wire(t.detach())
        try:
            work = self.data.send([buf], self.rank_of[to], self._tag(iteration, g, direction))
        except Exception as exc:
            raise CommError(f"send to {to} failed: {said(exc)}", to) from exc
        self._pending.append((work, buf, to))

    def recv(self, shape, frm: Worker, iteration: int, g: int, direction: int,
             dtype=torch.float32) -> torch.Tensor:
        return self._recv_into(lambda dev: torch.empty(shape, dtype=dtype, device=dev), frm,
                               iteration, g, direction)

    # ---- activations and gradients (any tensors; spec agreed once per version) ---------
    def _spec_key(self, stage: int) -> str:
        return P.activation_spec_key(self.version, stage)

    def activation_spec(self, stage: int, out: Optional[Activation] = None) -> ActivationSpec:
        """The spec of stage `stage`'s output under this plan version. Its first sender
        publishes it (compare_set: the first of the stage's replicas wins and every other
        must match); a receiver reads it once, waiting for the first sender if need be, and
        caches it. One store round trip per boundary and version, none per message."""
        spec = self._specs.get(stage)
        if spec is not None:
            return spec
        key = self._spec_key(stage)
        if out is not None:
            mine = ActivationSpec.of(out, f"stage {stage}'s output")
            agreed = ActivationSpec.from_json(self.store.compare_set(key, "", mine.to_json()))
            if agreed != mine:
                raise ActivationSpecError(
                    f"stage {stage}'s output is {mine} on worker {self.me[0]}:{self.me[1]} "
                    f"but {agreed} on another replica of the stage: replicas must build the "
                    f"same stage")
            spec = mine
        else:
            self._await_key(key, f"the spec of stage {stage}'s output")
            spec = ActivationSpec.from_json(self.store.get(key))
        self._specs[stage] = spec
        return spec

    def _await_key(self, key: str, what: str) -> None:
        """Wait for a store key like a polled wait: deadline, or a newer plan dropping one
        of this world's members (the publisher may be dead)."""
        self._wait_until(lambda: self.store.check([key]), what, None, max_poll_s=0.005)

    def _wait_until(self, done, what: str, peer: Optional[Worker], poll_s: float = 0.0005,
                    max_poll_s: float = 0.0005, limit: Optional[timedelta] = None) -> None:
        """Poll done() until true, within the comm timeout (or `limit`), leaving as soon as
        a newer plan no longer has this world's members (one of them died: never done)."""
        wait_until(done, f"v{self.version} {what}",
                   limit_s=(limit or self.timeout).total_seconds(),
                   newer=self._newer, leave_for=self._drops_member, peer=peer,
                   poll_s=poll_s, max_poll_s=max_poll_s)

    def send_activation(self, out: Activation, stage: int, to: Worker, iteration: int, g: int) -> None:
        """Stage `stage`'s output of micro-batch g: checked against the agreed spec, one message."""
        spec = self.activation_spec(stage, out)
        spec.check(out, f"stage {stage}'s output for micro-batch {g}")
        self.send(spec.pack(out), to, iteration, g, FWD)

    def recv_activation(self, stage: int, frm: Worker, iteration: int, g: int) -> Activation:
        """Stage `stage`'s output of micro-batch g, as the sender's tensors (views of one buffer)."""
        spec = self.activation_spec(stage)
        return spec.unpack(self._recv_into(spec.empty, frm, iteration, g, FWD))

    def post_early(self, stage: int, frm: Worker, iteration: int, g: int, direction: int) -> bool:
        """Post now the receive a later recv_activation/recv_grad of these arguments will
        take, if this boundary's spec is known already (never waits). gloo only: NCCL runs
        a communicator's p2p operations in order, so an early receive would hold back the
        sends queued after it (two stages each waiting for the other's send)."""
        key = (iteration, g, direction)
        if self.nccl or key in self._early or stage not in self._specs:
            return False
        spec = self._specs[stage] if direction == FWD else self._specs[stage].grad()
        if spec.empty_message:
            return False
        buf = spec.empty(self._wire_device)
        self._early[key] = (self._post_recv(buf, frm, iteration, g, direction), buf)
        return True

    def early_count(self) -> int:
        return len(self._early)

    def send_grad(self, grads, stage: int, to: Worker, iteration: int, g: int) -> None:
        """The gradient message for stage `stage`'s output of micro-batch g."""
        spec = self.activation_spec(stage).grad()
        if not spec.empty_message:
            self.send(spec.pack(grad_message(spec, grads)), to, iteration, g, BWD)

    def recv_grad(self, stage: int, frm: Worker, iteration: int, g: int):
        spec = self.activation_spec(stage).grad()
        if spec.empty_message:
            return ()
        return spec.unpack(self._recv_into(spec.empty, frm, iteration, g, BWD))

    @property
    def _wire_device(self) -> torch.device:
        return self.device if self.nccl else torch.device("cpu")

    def _post_recv(self, buf: torch.Tensor, frm: Worker, iteration: int, g: int,
                   direction: int) -> dist.Work:
        try:  # posting may fail too when the peer's pair is already closed
            return self.data.recv([buf], self.rank_of[frm], self._tag(iteration, g, direction))
        except Exception as exc:
            raise CommError(f"v{self.version} recv of micro-batch {g} from {frm}: "
                            f"{said(exc)}", frm) from exc

    def _recv_into(self, make_buf: Callable[[torch.device], torch.Tensor], frm: Worker,
                   iteration: int, g: int, direction: int) -> torch.Tensor:
        early = self._early.pop((iteration, g, direction), None)
        if early is not None:  # posted ahead: its own buffer holds the message
            work, buf = early
        else:
            buf = make_buf(self._wire_device)
            work = self._post_recv(buf, frm, iteration, g, direction)
        if self.on_idle is not None and not work.is_completed():
            self.on_idle()
        self._wait(work, f"recv of micro-batch {g} from {frm}", frm)
        return buf if buf.device == self.device else buf.to(self.device)

    def flush(self) -> None:
        pending, self._pending = self._pending, []
        for work, _, to in pending:
            self._wait(work, f"send to {to}", to)

    def _wait(self, work, what: str, peer: Optional[Worker] = None,
              limit: Optional[timedelta] = None) -> None:
        if self.poll_waits:
            return self._poll(work, what, peer, limit)
        try:
            if not work.wait(timeout=limit or self.timeout):
                raise RuntimeError("timed out")
        except CommError:
            raise
        except Exception as exc:
            raise CommError(f"v{self.version} {what}: {said(exc)}", peer) from exc

    def _poll(self, work, what: str, peer: Optional[Worker],
              limit: Optional[timedelta] = None) -> None:
        """Wait for `work` without blocking in it (see _wait_until). The caller's abort
        (close) frees the communicator."""
        try:
            self._wait_until(work.is_completed, what, peer, limit=limit)
            work.wait()  # completed: raises if it completed with an error
        except CommError:
            raise
        except Exception as exc:
            raise CommError(f"v{self.version} {what}: {said(exc)}", peer) from exc

    def _drops_member(self, plan) -> bool:
        """The newer plan lists other workers, or another process for one of them."""
        live = sorted(tuple(w.key) for w in plan.workers)
        if live != self.workers:
            return True
        return (self.incarnations is not None
                and any(plan.incarnation(*w) != self.incarnations.get(w, 1) for w in self.workers))

    # ---- collectives -----------------------------------------------------------------
    def allreduce_stage(self, flat: torch.Tensor) -> torch.Tensor:
        """SUM over this stage's live peers (in place on the returned tensor)."""
        buf = self._wire(flat)
        # gloo does not say who is late: name a stage peer (exact for two replicas)
        peer = next((w for w in self.workers if w[1] == self.me[1] and w != self.me), None)
        try:
            work = self.stage_group.allreduce([buf])
        except Exception as exc:
            raise CommError(f"all-reduce of stage {self.me[1]} failed: {said(exc)}", peer) from exc
        self._wait(work, f"all-reduce of stage {self.me[1]}", peer)
        return buf.to(flat.device) if buf is not flat else flat

    def barrier(self) -> None:
        """Every live worker of this version gets here (a synchronous optimizer's barrier)."""
        try:
            work = self.ctrl.barrier()
        except Exception as exc:
            raise CommError(f"v{self.version} barrier failed: {said(exc)}") from exc
        self._wait(work, "barrier")

    def allgather_ints(self, values: Sequence[int]) -> dict[Worker, list[int]]:
        mine = torch.tensor(list(values), dtype=torch.int64)
        out = [torch.empty_like(mine) for _ in self.workers]
        try:
            work = self.ctrl.allgather([out], [mine])
        except Exception as exc:
            raise CommError(f"v{self.version} all-gather failed: {said(exc)}") from exc
        self._wait(work, "all-gather")
        return {w: t.tolist() for w, t in zip(self.workers, out)}

    def send_blob(self, obj, to: Worker) -> None:
        """Any torch-serialisable object (a state dict) to one peer, blocking."""
        bio = io.BytesIO()
        torch.save(obj, bio)
        data = torch.frombuffer(bytearray(bio.getvalue()), dtype=torch.uint8)
        size = torch.tensor([data.numel()], dtype=torch.int64)
        for i, t in enumerate((size, data)):
            self._wait(self._post(self.ctrl.send, t, to, _BLOB_TAG + i), f"state to {to}", to,
                       self.state_timeout)

    def recv_blob(self, frm: Worker):
        """The sender's object. Waited for up to the state limit, not the comm timeout: the
        sender first gathers and serialises it (a stage's pieces from snapshots, gigabytes
        at a time), and a receiver that gave up sooner failed the version every time it
        was re-published (a change of shape under a profiler, with a 2 s timeout, never
        got past its transfers)."""
        size = torch.empty(1, dtype=torch.int64)
        self._wait(self._post(self.ctrl.recv, size, frm, _BLOB_TAG), f"state from {frm}", frm,
                   self.state_timeout)
        data = torch.empty(int(size), dtype=torch.uint8)
        self._wait(self._post(self.ctrl.recv, data, frm, _BLOB_TAG + 1), f"state from {frm}", frm,
                   self.state_timeout)
        return torch.load(io.BytesIO(data.numpy().tobytes()), map_location=self.device,
                          weights_only=False)

    def _post(self, op, t: torch.Tensor, peer: Worker, tag: int):
        try:
            return op([t], self.rank_of[peer], tag)
        except Exception as exc:
            raise CommError(f"v{self.version} transfer with {peer}: {said(exc)}", peer) from exc

    def close(self) -> None:
        """Leave the world; peers blocked on us get 'connection closed' at once. Dropping
        the last reference is what closes gloo's sockets; NCCL needs its abort. gloo's
        destructor waits for an operation still pending on a hung peer (up to the comm
        timeout; its abort does not cut it short), so the groups are dropped on a
        background thread: the worker moves on to the next version meanwhile."""
        self._pending.clear()
        self._early.clear()
        links = getattr(self, "_links", None)
        if links is not None:
            links.close()
        groups = []
        for name in ("stage_group", "data", "ctrl"):
            pg = getattr(self, name, None)
            setattr(self, name, None)
            if pg is not None and self.nccl:
                try:
                    pg.abort()
                except Exception:  # a broken group still releases its resources
                    pass
            if pg is not None and all(pg is not g for g in groups):
                groups.append(pg)
            del pg
        if groups:
            threading.Thread(target=groups.clear, name=f"close-v{self.version}",
                             daemon=True).start()
