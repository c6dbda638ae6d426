# Hygiene: master port holder ($2 = 1 on the master), the holders of the ports this node may
# host a pair's rendezvous on ($6, space-separated), how every cluster name resolves, GPUs
# visible, CUDA_VISIBLE_DEVICES, this node's hostname, the NCCL/Gloo environment, this node's
# hostfile slots, SysV shm, the boot and how many kernel lines match the GPU/fabric error
# pattern ($5) for the stamps.
port=$1 is_master=$2 me=$3 hostfile=$4 pattern=$5 pairs=$6; shift 6
if [ "$is_master" = 1 ]; then ss -Hltnp "sport = :$port" 2>/dev/null | head -n 1 | sed 's/^/holder /'; fi
# one listing for every pair port (hundreds on a large cluster): the first holder of each
[ -n "$pairs" ] && ss -Hltnp 2>/dev/null | awk -v ports=" $pairs " '
  { n = split($4, at, ":"); p = at[n] }
  index(ports, " " p " ") && !(p in seen) { seen[p] = 1; print "pairport " p " " $0 }'
for n in "$@"; do echo "resolve $n $(getent ahostsv4 "$n" | awk 'NR==1 {print $1}')"; done
echo "hostname $(hostname)"
command -v nvidia-smi >/dev/null 2>&1 && { echo "gpus"; nvidia-smi -L 2>/dev/null | sed 's/^/gpu /'; }
echo "cvd ${CUDA_VISIBLE_DEVICES-}"
env | grep -E '^(NCCL|GLOO)_' | sed 's/^/env /'
awk -v me="$me" '$1 == me { sub("slots=", "", $2); print "slots " $2 }' "$hostfile" 2>/dev/null
if d=$(dmesg 2>/dev/null); then
  m=$(printf '%s\n' "$d" | grep -E -- "$pattern")
  # the count, and the last one's time: a ring buffer that rotated new lines in keeps neither
  echo "kernel $(cat /proc/sys/kernel/random/boot_id) $(printf '%s' "$m" | grep -c '') $(printf '%s\n' "$m" | tail -n 1 | sed -n 's/^\[ *\([0-9]*\.[0-9]*\)\].*/\1/p')"
fi
sed 's/^/sysvipc /' /proc/sysvipc/shm 2>/dev/null; echo "sysvipc now $(date +%s)"
true
