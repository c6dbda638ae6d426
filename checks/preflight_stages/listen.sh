# Listeners that accept and close, for at most $1 seconds, on each ADDR PORT pair after $2;
# one `pid N` line each. $2, the run's token, is in each one's command line only to be found
# there: the preflight ends only processes that carry it.
seconds=$1 token=$2; shift 2
while [ $# -ge 2 ]; do
  nohup timeout "$seconds" python3 -I -c '
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(128)
while True:
    c, _ = s.accept(); c.close()
' "$1" "$2" "$token" >/dev/null 2>&1 &
  pid=$!
  # Print the PID once it listens (at most 5 s): the probes start as soon as this returns.
  n=0
  while [ $n -lt 50 ] && ! ss -Hltn "src $1:$2" 2>/dev/null | grep -q .; do sleep 0.1; n=$((n + 1)); done
  echo "pid $pid"
  shift 2
done
