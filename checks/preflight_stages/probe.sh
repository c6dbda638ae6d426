# Connect from this node's cluster address to each target (name=addr:port), 3 s each, in parallel.
timeout 10 python3 -I -c '
import socket, sys, threading
src = sys.argv[1]
def probe(spec):
    name, _, target = spec.partition("=")
    addr, _, port = target.rpartition(":")
    try:
        s = socket.socket(); s.settimeout(3); s.bind((src, 0)); s.connect((addr, int(port))); s.close()
        print("ok", name, flush=True)
    except Exception as exc:
        print("fail", name, type(exc).__name__, exc, flush=True)
threads = [threading.Thread(target=probe, args=(t,)) for t in sys.argv[2:]]
[t.start() for t in threads]; [t.join() for t in threads]
' "$@"
