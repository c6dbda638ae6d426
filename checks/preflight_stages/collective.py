# The preflight's collective, run by the pinned venv python of every rank at once (one rank per
# GPU, one per CPU node). Prints one JSON line per step, so the controller knows how far each
# rank got even when the run is cut off. Arguments: LOCAL_RANK BACKEND JOB..., each JOB
# "END,FIRST,WORLD,MASTER_ADDR,MASTER_PORT,BYTES": a process group of its own, this rank being
# FIRST + LOCAL_RANK of WORLD, which must end END seconds after this process started; the jobs
# run one after the other in this one process (torch is imported once). With BYTES > 0, a timed
# all_reduce of that many bytes follows (the bandwidth stage's pairs). A job without BYTES that
# fails (the whole cluster's collective) ends the process: no pair can be measured where
# the cluster cannot train. A rail pair's JOB has two more fields, ",RAIL,LOCAL": only local rank
# LOCAL runs it, as rank FIRST of WORLD, over that one interface or HCA (``use_rail``); the other
# local ranks skip it. Every step names its job; a step without one (the import, or what
# collective.sh adds) is the process's.
# Run as `python -I -c` in a private root-only directory: no module a node user planted in the
# working directory (or named in PYTHON* variables) is imported instead of the standard library's.
# The rendezvous store is the ranks' own (``StoreServer`` and ``Client`` below, torch-free, so
# tests import this file without torch and speak the protocol over real sockets), not torch's
# TCPStore, which any user who reaches its port may read, list and write: rank 0 of a job serves
# it on its node's cluster address only, and serves a connection only once both ends proved
# they hold the run's secret (the file ``secret`` collective.sh wrote from stdin into this
# directory, root's alone) for this job (its address, port, world, end and bytes). Rank 0 prints,
# just before the job's last step, how many connections its store refused (``store`` step).
import hashlib
import hmac
import json
import os
import re
import socket
import struct
import sys
import threading
import time
from datetime import timedelta


def say(step, **data):
    print(json.dumps({"step": step, **data}), flush=True)


class Failed(Exception):
    """A job's own failure, in its stage's words."""

    def __init__(self, stage, error, **data):
        super().__init__(error)
        self.stage, self.data = stage, data


# ---- the rendezvous store's protocol (no torch) ----------------------------------------------

SECRET_FILE = "secret"  # collective.sh wrote it from stdin (0600, in this root-only directory)
MAX_FIELD = 1 << 20  # a store value: an address, NCCL's unique id, a host name
MAX_FIELDS = 1 << 16
HANDSHAKE = 5.0  # seconds a connection has to prove itself, in one message
PENDING = 256  # connections proving themselves at once; more are closed at once (a flood)


class Invalid(ValueError):
    """What a rank of the job never sends: the peer is not one."""


class StoreTimeout(Exception):
    """A key the store did not get in time."""


def read_secret():
    """The run's secret (never printed): without one no store is served or joined."""
    try:
        with open(SECRET_FILE, "rb") as f:
            secret = f.read().strip()
    except OSError:
        secret = b""
    if len(secret) < 32:
        raise Failed("secret", "no secret for the rendezvous store (none came on stdin)")
    return secret


def job_context(address, port, world, end, nbytes):
    """What a proof is for: one job of the command, as every rank of it was given it (its
    address, port, world, end and bytes; not its place in a node's list of jobs, which differs
    between the pair's two nodes): a proof for another job's store is not this one's."""
    return f"{address}:{port}:{world}:{end}:{nbytes}".encode()


def send(sock, *fields):
    sock.sendall(
        struct.pack("!I", len(fields)) + b"".join(struct.pack("!I", len(f)) + f for f in fields)
    )


def receive_exactly(sock, size, until=None):
    data = bytearray()
    while len(data) < size:
        if until is not None:  # a bound on the whole message, not on each piece of it
            sock.settimeout(max(0.01, until - time.monotonic()))
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the rendezvous connection closed")
        data += chunk
    return bytes(data)


def receive(sock, fields=MAX_FIELDS, size=MAX_FIELD, until=None):
    """One message: its fields, bounded in number and size (anything else is ``Invalid``)."""
    (count,) = struct.unpack("!I", receive_exactly(sock, 4, until))
    if count > fields:
        raise Invalid("too many fields")
    message = []
    for _ in range(count):
        (length,) = struct.unpack("!I", receive_exactly(sock, 4, until))
        if length > size:
            raise Invalid("a field too large")
        message.append(receive_exactly(sock, length, until))
    return message


def proof(secret, who, context, nonces):
    """HMAC of who proves (b"rank" or b"store"), the job it is for and both ends' nonces."""
    message = who + struct.pack("!I", len(context)) + context + nonces
    return hmac.new(secret, message, hashlib.sha256).digest()


def _number(value):
    try:
        return int(value)
    except ValueError:
        raise Invalid("not a number") from None


class StoreServer:
    """A job's rendezvous store, served by its rank 0 on its node's cluster address alone (not
    every interface); a connection is served once it proved it holds the run's secret for this
    job (an HMAC of the job's ``context`` and both ends' fresh nonces), and the server proves it
    back. Values are bytes; what ``add`` counts is decimal text, as in torch's stores.

    ``refused`` counts the connections no rank of the job would make: closed because
    ``pending`` others were proving themselves, failed or unfinished handshakes (a silent peer
    is dropped after ``handshake`` seconds; those still proving when the store closes count
    too), and anything invalid sent after it. A rank of the run that reached another job's
    store (its proof valid, for its own job) is closed uncounted."""

    def __init__(self, address, port, secret, context, pending=PENDING, handshake=HANDSHAKE):
        self.secret, self.data, self.changed = secret, {}, threading.Condition()
        self.context, self.handshake_bound = context, handshake
        self.slots, self.counted = threading.BoundedSemaphore(pending), threading.Lock()
        self.dropped = self.proving = 0
        family, kind, proto, _, where = socket.getaddrinfo(address, port, 0, socket.SOCK_STREAM)[0]
        self.sock = socket.socket(family, kind, proto)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT, not stealing
        try:
            self.sock.bind(where)
            self.sock.listen(1024)
        except OSError as exc:
            self.sock.close()
            why = f"cannot serve the rendezvous on {address}:{port}: {exc}"
            raise Failed("store", why) from None
        threading.Thread(target=self.accept, daemon=True).start()

    @property
    def refused(self):
        with self.counted:
            return self.dropped + self.proving

    def count(self, dropped=0, proving=0):
        with self.counted:
            self.dropped += dropped
            self.proving += proving

    def accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # closed: the job is over
            if not self.slots.acquire(blocking=False):
                conn.close()  # root's process keeps its threads and memory bounded
                self.count(dropped=1)
                continue
            self.count(proving=1)
            threading.Thread(target=self.serve, args=(conn,), daemon=True).start()

    def serve(self, conn):
        with conn:
            try:
                proved = self.prove(conn)
            except (OSError, ValueError, struct.error):
                proved = False
            finally:
                self.slots.release()
            self.count(proving=-1, dropped=0 if proved is not False else 1)
            try:
                while proved:
                    send(conn, *self.answer(receive(conn)))
            except (ValueError, struct.error):
                self.count(dropped=1)  # a proved peer sent what no rank sends
            except OSError:
                return  # the rank closed its end (or was ended): not an intruder

    def prove(self, conn):
        """True: the peer proved it holds the secret for this job (then the server proves it
        back); None: a rank of the run for another job; False: anyone else."""
        until = time.monotonic() + self.handshake_bound
        mine = os.urandom(32)
        conn.settimeout(self.handshake_bound)
        send(conn, mine)
        theirs, context, shown = receive(conn, 3, 256, until)
        nonces = mine + theirs
        if len(theirs) != 32:
            return False
        if hmac.compare_digest(shown, proof(self.secret, b"rank", self.context, nonces)):
            send(conn, proof(self.secret, b"store", self.context, nonces))
            conn.settimeout(None)
            return True
        if context != self.context and hmac.compare_digest(
            shown, proof(self.secret, b"rank", context, nonces)
        ):
            return None
        return False

    def wait_for(self, keys, millis):
        return self.changed.wait_for(lambda: all(k in self.data for k in keys), millis / 1000)

    def answer(self, request):
        op, args = (request[0], request[1:]) if request else (b"", [])
        with self.changed:
            if op == b"set" and len(args) == 2:
                self.data[args[0]] = args[1]
                self.changed.notify_all()
                return [b"ok"]
            if op == b"get" and len(args) == 2:
                if not self.wait_for(args[:1], _number(args[1])):
                    return [b"timeout"]
                return [b"ok", self.data[args[0]]]
            if op == b"add" and len(args) == 2:
                value = _number(self.data.get(args[0], b"0")) + _number(args[1])
                self.data[args[0]] = str(value).encode()
                self.changed.notify_all()
                return [b"ok", self.data[args[0]]]
            if op == b"check":
                return [b"ok", b"1" if all(k in self.data for k in args) else b"0"]
            if op == b"wait" and args:
                return [b"ok"] if self.wait_for(args[1:], _number(args[0])) else [b"timeout"]
            if op == b"compare_set" and len(args) == 3:
                key, expected, desired = args
                if key not in self.data:
                    if expected:
                        return [b"ok", expected]
                    self.data[key] = desired
                elif self.data[key] == expected:
                    self.data[key] = desired
                self.changed.notify_all()
                return [b"ok", self.data[key]]
            if op == b"delete_key" and len(args) == 1:
                return [b"ok", b"1" if self.data.pop(args[0], None) is not None else b"0"]
            if op == b"num_keys":
                return [b"ok", str(len(self.data)).encode()]
        raise Invalid("unknown request")

    def close(self):
        """Stops serving; returns ``refused`` as it stands."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accept
        except OSError:
            pass
        self.sock.close()
        return self.refused


def connect(address, port, secret, deadline, context, handshake=HANDSHAKE):
    """A connection to the job's store, proved both ways, retried until ``deadline`` (the
    server may not be up yet); a server that cannot prove the secret is not the job's: never
    used."""
    impostor = False
    while time.monotonic() < deadline:
        try:
            sock = socket.create_connection((address, port), timeout=handshake)
        except OSError:
            time.sleep(0.1)
            continue
        try:
            (theirs,) = receive(sock, 1, 32, time.monotonic() + handshake)
            mine = os.urandom(32)
            nonces = theirs + mine
            send(sock, mine, context, proof(secret, b"rank", context, nonces))
            (shown,) = receive(sock, 1, 32, time.monotonic() + handshake)
            if hmac.compare_digest(shown, proof(secret, b"store", context, nonces)):
                sock.settimeout(None)
                return sock
            impostor = True
        except (OSError, ValueError, struct.error):
            pass
        sock.close()
        time.sleep(0.1)
    raise Failed("rendezvous", "timeout", reached=False, **({"impostor": True} if impostor else {}))


class Client:
    """One connection of a rank to its job's ``StoreServer``; keys and values are bytes,
    waits in milliseconds."""

    def __init__(self, address, port, secret, deadline, context, handshake=HANDSHAKE):
        self.lock, self.where = threading.Lock(), (address, port, secret, deadline, context)
        self.sock = connect(address, port, secret, deadline, context, handshake)

    def clone(self):
        return Client(*self.where)

    def call(self, *fields, millis=0):
        with self.lock:
            self.sock.settimeout(millis / 1000 + 30)
            send(self.sock, *fields)
            answer = receive(self.sock)
        if answer[:1] == [b"timeout"]:
            raise StoreTimeout(f"timed out waiting for {fields[1:2]!r} in the rendezvous store")
        if answer[:1] != [b"ok"]:
            raise RuntimeError(f"the rendezvous store refused {fields[0]!r}")
        return answer[1:]

    def set(self, key, value):
        self.call(b"set", key, value)

    def get(self, key, millis):
        return self.call(b"get", key, str(millis).encode(), millis=millis)[0]

    def add(self, key, amount):
        return int(self.call(b"add", key, str(int(amount)).encode())[0])

    def check(self, keys):
        return self.call(b"check", *keys)[0] == b"1"

    def wait(self, keys, millis):
        self.call(b"wait", str(millis).encode(), *keys, millis=millis)

    def compare_set(self, key, expected, desired):
        return self.call(b"compare_set", key, expected, desired)[0]

    def delete_key(self, key):
        return self.call(b"delete_key", key)[0] == b"1"

    def num_keys(self):
        return int(self.call(b"num_keys")[0])

    def close(self):
        self.sock.close()


def meet(client, rank, world, deadline):
    """The job's rendezvous in its store, first, so that on a timeout the ranks can say which
    ranks joined and which did not (only the job's ranks can write there). Each rank waits in
    the store for the last one to join to say so (one request per rank, not a poll: the store
    is a python thread of rank 0's, and a job may have thousands)."""
    client.set(f"joined/{rank}".encode(), socket.gethostname().encode())
    if client.add(b"joined", 1) == world:
        client.set(b"joined/all", b"1")
    try:
        client.wait([b"joined/all"], int(max(0.01, deadline - time.monotonic()) * 1000))
    except StoreTimeout:
        count = client.add(b"joined", 0)
        joined = [r for r in range(world) if client.check([f"joined/{r}".encode()])]
        missing = [r for r in range(world) if r not in joined]
        raise Failed("rendezvous", "timeout", joined=joined, missing=missing, count=count) from None


# ---- the ranks (torch) -----------------------------------------------------------------------

torch = dist = None  # imported by main(): this file's protocol above needs neither
CLONES = []


def kept(store):
    """``store``, held for the process's life: torch keeps only its C++ half, and NCCL calls
    the Python half's methods (``clone`` for its watchdog) after init_process_group returned;
    a store Python had collected fails there ("Not implemented", seen on the lent H200)."""
    CLONES.append(store)
    return store


def as_bytes(value):
    return value.encode() if isinstance(value, str) else bytes(value)


def store_class():
    """``Store``: a ``torch.distributed.Store`` over a ``Client``, for this rank and its process
    group (gloo and NCCL exchange their addresses through it)."""
    late = getattr(dist, "DistStoreError", TimeoutError)  # what torch's stores raise

    class Store(dist.Store):
        def __init__(self, client, deadline):
            super().__init__()
            self.client, self.deadline = client, deadline
            self.set_timeout(timedelta(seconds=max(1.0, deadline - time.monotonic())))

        def clone(self):
            """A connection of its own (for a thread of torch's); kept: torch holds no Python
            reference to it."""
            return kept(Store(self.client.clone(), self.deadline))

        def millis(self, timeout=None):
            return int((timeout or self.timeout).total_seconds() * 1000)

        def set(self, key, value):
            self.client.set(as_bytes(key), as_bytes(value))

        def get(self, key):
            try:
                return self.client.get(as_bytes(key), self.millis())
            except StoreTimeout as exc:
                raise late(str(exc)) from None

        def add(self, key, amount):
            return self.client.add(as_bytes(key), amount)

        def check(self, keys):
            return self.client.check(list(map(as_bytes, keys)))

        def wait(self, keys, timeout=None):
            try:
                self.client.wait(list(map(as_bytes, keys)), self.millis(timeout))
            except StoreTimeout as exc:
                raise late(str(exc)) from None

        def compare_set(self, key, expected, desired):
            return self.client.compare_set(as_bytes(key), as_bytes(expected), as_bytes(desired))

        def delete_key(self, key):
            return self.client.delete_key(as_bytes(key))

        def num_keys(self):
            return self.client.num_keys()

        def close(self):
            self.client.close()

    return Store


def sync():
    if backend == "nccl":
        torch.cuda.synchronize()


def timed_all_reduce(device, rank, world, nbytes):
    """Warm-up, then all_reduce of an nbytes buffer repeated for about a second (the same count
    on every rank: the slowest warm-up decides), seconds per all_reduce on this rank."""
    buf = torch.full((nbytes // 4,), float(rank + 1), dtype=torch.float32, device=device)
    dist.all_reduce(buf)  # checked: a large buffer arrives whole, not only a small one
    if not bool(torch.all(buf == world * (world + 1) / 2)):
        raise Failed("bandwidth", "the large all_reduce gave a wrong sum")
    buf.zero_()
    started = time.perf_counter()
    for _ in range(2):
        dist.all_reduce(buf)
    sync()
    warm = torch.tensor([(time.perf_counter() - started) / 2], dtype=torch.float64, device=device)
    dist.all_reduce(warm, op=dist.ReduceOp.MAX)
    iters = max(3, min(20, int(1.0 / max(float(warm[0]), 1e-6))))
    dist.barrier()
    started = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(buf)
    sync()
    return (time.perf_counter() - started) / iters, iters


def run(job, rank, world, master, port, nbytes, deadline, secret, context):
    """One job; its rank 0 serves the job's store until the job ends here, and says, just
    before the job's last step (done, timeout or error), how many connections it refused."""
    server = StoreServer(master, port, secret, context) if rank == 0 else None
    try:
        passed = joined_run(job, rank, world, master, port, nbytes, deadline, secret, context)
    finally:
        if server:
            say("store", job=job, refused=server.close())
    say("done", job=job)
    return passed


def joined_run(job, rank, world, master, port, nbytes, deadline, secret, context):
    client = Client(master, port, secret, deadline, context)
    say("reached", job=job)
    meet(client, rank, world, deadline)
    say("joined", job=job)
    if backend == "nccl":
        torch.cuda.set_device(local)  # local rank i: the i-th device CUDA_VISIBLE_DEVICES leaves
    dist.init_process_group(
        backend,
        store=kept(store_class()(client, deadline)),
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=max(1.0, deadline - time.monotonic())),
    )
    say("initialised", job=job, backend=backend)
    device = torch.device("cuda", local) if backend == "nccl" else torch.device("cpu")
    value = torch.full((4,), float(rank + 1), device=device)
    dist.all_reduce(value)
    expected = world * (world + 1) / 2
    say(
        "all_reduce",
        job=job,
        ok=bool(torch.all(value == expected)),
        got=float(value[0]),
        expected=expected,
    )
    versions = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if backend == "nccl" else None,
    }
    # all_gather of fixed-size byte tensors (all_gather_object would need numpy in the venv)
    blob = json.dumps(versions).encode()[:255].ljust(256, b" ")
    mine = torch.tensor(list(blob), dtype=torch.uint8, device=device)
    gathered = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(gathered, mine)
    gathered_v = [json.loads(bytes(t.cpu().tolist()).decode()) for t in gathered]
    say("all_gather", job=job, versions=gathered_v)
    if nbytes > 0:
        seconds, iters = timed_all_reduce(device, rank, world, nbytes)
        say("bandwidth", job=job, bytes=nbytes // 4 * 4, seconds=seconds, iters=iters)
    dist.barrier()
    # the cluster's collective passed here: the right sum, and the same versions on every rank
    return bool(torch.all(value == expected)) and len({json.dumps(v) for v in gathered_v}) == 1


current = {"job": 0, "until": float("inf")}
RAIL_NAME = re.compile(r"[A-Za-z0-9_.:@-]{1,64}")


def use_rail(rail):
    """A rail pair's one interface or HCA (``if:eth2``, ``hca:mlx5_4``), for the process group
    made next: gloo and NCCL's sockets read their interface then; NCCL reads NCCL_IB_HCA once
    per process, at its first group, and this process runs this one rail's pairs alone."""
    kind, _, name = rail.partition(":")
    if kind not in ("if", "hca") or not RAIL_NAME.fullmatch(name):
        raise Failed("rail", f"not a rail: {rail!r}")
    if kind == "if":
        os.environ["GLOO_SOCKET_IFNAME"] = name
        os.environ["NCCL_SOCKET_IFNAME"] = "=" + name
    else:
        os.environ["NCCL_IB_HCA"] = "=" + name


def watchdog():
    """A job past its end (and 5 s of grace) that nothing interrupted, such as a hung CUDA or
    NCCL call: the process ends (exit 124, as timeout(1) would), so the collective keeps its
    own bound and a pair its round's; the jobs after it do not run."""
    while time.monotonic() <= current["until"]:
        time.sleep(0.2)
    os._exit(124)


local = backend = None  # this process's local rank and backend, set by main()


def main():
    global local, backend, torch, dist
    local, backend = int(sys.argv[1]), sys.argv[2]
    jobs = [job.split(",") for job in sys.argv[3:]]
    started = time.monotonic()
    visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]
    gpu = (
        (
            visible[local]
            if local < len(visible)
            else f"none (CUDA_VISIBLE_DEVICES lists {len(visible)})"
        )
        if visible
        else local
    )
    first = jobs[0][1]
    say(
        "start",
        job=0,
        rank=int(first) + local,
        local=local,
        host=socket.gethostname(),
        gpu=gpu if backend == "nccl" else None,
    )
    if all(len(fields) == 8 and int(fields[7]) != local for fields in jobs):
        sys.exit(0)  # every job is another local rank's rail (a re-measure): no torch, no GPU
    # A pair NCCL gives up on (its timeout: the job's end) raises in this process instead of
    # ending it, so the jobs after it still run: the watchdog bounds what never returns.
    os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "2"
    try:
        import torch
        import torch.distributed as dist
    except Exception as exc:  # the venv itself is broken: its own words ("No module named ...")
        say("error", stage="import", error=f"{type(exc).__name__}: {exc}")
        sys.exit(2)
    threading.Thread(target=watchdog, daemon=True).start()
    try:
        secret = read_secret()
    except Failed as failed:
        say("error", stage=failed.stage, error=str(failed))
        sys.exit(2)
    status, passed = 0, True
    for job, fields in enumerate(jobs):
        end, first, world, master, port, nbytes = fields[:6]
        rail = fields[6] if len(fields) == 8 else None  # a rail pair: one rank of each node's
        if rail is not None and int(fields[7]) != local:
            continue  # another local rank's rail
        rank = int(first) + (0 if rail is not None else local)
        world, nbytes = int(world), int(nbytes)
        if job and not passed and not int(jobs[job - 1][5]):
            break  # the collective failed: its exit status and words stay its own
        current.update(job=job, until=started + float(end) + 5)
        if job:
            say("start", job=job, rank=rank, local=local, gpu=gpu if backend == "nccl" else None)
        try:
            if rail is not None:
                use_rail(rail)
            context = job_context(master, port, world, end, nbytes)
            deadline = started + float(end)
            passed = run(job, rank, world, master, int(port), nbytes, deadline, secret, context)
            status = 0
        except Failed as failed:
            kind = "timeout" if failed.stage == "rendezvous" else "error"
            say(
                kind,
                job=job,
                stage=failed.stage,
                **({"error": str(failed)} if kind == "error" else {}),
                **failed.data,
            )
            status, passed = (3 if kind == "timeout" else 4), False
        except Exception as exc:
            said = str(exc).splitlines()[0] if str(exc) else ""
            say("error", job=job, stage="collective", error=f"{type(exc).__name__}: {said}")
            status, passed = 4, False
        finally:  # the next job makes a process group of its own
            try:
                if dist.is_initialized():
                    dist.destroy_process_group()
            except Exception:
                pass
    current["until"] = float("inf")
    sys.exit(status)  # the last job's that ran: what collective.sh adds (exit, stderr) is its own


if __name__ == "__main__":
    main()
