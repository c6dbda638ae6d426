# The collective's ranks on this node: $1 the python (the pinned venv's, or preflight.python), $2 seconds, $3 the script,
# $4 its number of ranks, then the script's arguments after LOCAL_RANK. Each rank runs at once, its output in files of its own; then each rank's
# lines are printed behind its local rank ("3 {...}"): its steps, and when it failed its exit
# status and the last lines it wrote to stderr, and the lines of NCCL's INFO log that say which
# network it used. A python that is missing or cannot start prints no step of its own: this
# script says so (`nopython`, or the exit status), never a silence the controller could only
# call a timeout. The run's rendezvous secret comes on stdin (one line, never an argument or a
# variable another user could read): kept in this private root-only directory, 0600 (the
# umask), for the ranks, and removed with it.
python=$1 seconds=$2 script=$3 count=$4; shift 4
IFS= read -r secret || true
case $secret in *[!0-9a-f]* | "") echo "nosecret"; exit 2 ;; esac
printf '%s\n' "$secret" >secret || exit 97
secret=""
if [ ! -x "$python" ]; then echo "nopython $python"; exit 2; fi
pids="" i=0
while [ "$i" -lt "$count" ]; do
  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET NCCL_DEBUG_FILE="$PWD/nccl.$i" \
    timeout -k 2 "$seconds" "$python" -I -c "$script" "$i" "$@" >"out.$i" 2>"err.$i" &
  pids="$pids $!" i=$((i + 1))
done
status=0 i=0
for pid in $pids; do
  wait "$pid"; rc=$?
  { head -c 262144 "out.$i"; echo; } | grep -v '^$' | sed "s/^/$i /"
  if [ "$rc" != 0 ]; then status=$rc; echo "$i exit $rc"; tail -n 3 "err.$i" | cut -c1-400 | sed "s/^/$i stderr /"; fi
  # what NCCL decided (checks/fabric_verdicts.py, checks/nccl_decisions.py), each kind bounded:
  # its version, net plugin, network and GPUDirect RDMA; its network channels; its channels
  # between the node's GPUs
  { grep -m 12 -E 'NCCL INFO (NCCL version|NET/Plugin|Using (internal )?[Nn]etwork|NET/(IB|Socket) ?: ?(Using|GPU Direct RDMA)|.*NVLS)' "nccl.$i"
    grep -m 8 -E 'NCCL INFO (Channel|Ring) .* via NET/' "nccl.$i"
    grep -m 4 -E 'NCCL INFO (Channel|Ring) .* via (P2P|SHM)' "nccl.$i"; } 2>/dev/null \
    | cut -c1-300 | sed "s/^/$i nccl /"
  i=$((i + 1))
done
exit "$status"
