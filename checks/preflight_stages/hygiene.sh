# Hygiene: master port holder ($2 = 1 on the master), the holders of the ports this node may
# host a pair's rendezvous on ($6, space-separated; $7 its cluster address), how every cluster
# name resolves, GPUs visible, CUDA_VISIBLE_DEVICES, this node's hostname, the environment
# variables of the families $8 names (trainfleet.nccl.ENV_PREFIXES, space-separated), this node's
# hostfile slots, SysV shm, the boot and how many kernel lines match the GPU/fabric error
# pattern ($5) for the stamps.
port=$1 is_master=$2 me=$3 hostfile=$4 pattern=$5 pairs=$6 address=$7 prefixes=$8; shift 8
# One listing for both (hundreds of pair ports on a large cluster). ss missing or failing is
# `noss`: a listing that saw nothing is never "no holder".
if [ "$is_master" = 1 ] || [ -n "$pairs" ]; then
  if listening=$(ss -Hltnp 2>/dev/null); then
    [ "$is_master" = 1 ] && printf '%s\n' "$listening" | awk -v port="$port" '
      { n = split($4, at, ":") } at[n] == port { print "holder " $0; exit }'
    # the first holder of each pair port: only a listener on this node's cluster address or on
    # every address conflicts with the pair store's bind (one on 127.0.0.1 does not)
    [ -n "$pairs" ] && printf '%s\n' "$listening" | awk -v ports=" $pairs " -v me="$address" '
      { n = split($4, at, ":"); p = at[n]; a = substr($4, 1, length($4) - length(p) - 1)
        sub(/%.*/, "", a); gsub(/[][]/, "", a) }
      (a == "*" || a == "0.0.0.0" || a == "::" || a == me || a == "::ffff:" me) \
        && index(ports, " " p " ") && !(p in seen) { seen[p] = 1; print "pairport " p " " $0 }'
  else
    echo "noss"
  fi
fi
for n in "$@"; do echo "resolve $n $(getent ahostsv4 "$n" | awk 'NR==1 {print $1}')"; done
echo "hostname $(hostname)"
command -v nvidia-smi >/dev/null 2>&1 && { echo "gpus"; nvidia-smi -L 2>/dev/null | sed 's/^/gpu /'; }
echo "cvd ${CUDA_VISIBLE_DEVICES-}"
env | awk -v prefixes="$prefixes" 'BEGIN { n = split(prefixes, p, " ") }
  { for (i = 1; i <= n; i++) if (index($0, p[i]) == 1) { print "env " $0; next } }'
awk -v me="$me" '$1 == me { sub("slots=", "", $2); print "slots " $2 }' "$hostfile" 2>/dev/null
if d=$(dmesg 2>/dev/null); then
  m=$(printf '%s\n' "$d" | grep -E -- "$pattern")
  # the count, and the last one's time: a ring buffer that rotated new lines in keeps neither
  echo "kernel $(cat /proc/sys/kernel/random/boot_id) $(printf '%s' "$m" | grep -c '') $(printf '%s\n' "$m" | tail -n 1 | sed -n 's/^\[ *\([0-9]*\.[0-9]*\)\].*/\1/p')"
fi
sed 's/^/sysvipc /' /proc/sysvipc/shm 2>/dev/null; echo "sysvipc now $(date +%s)"
true
