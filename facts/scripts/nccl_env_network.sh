
root=$1
ip -o addr show 2>/dev/null | while read -r idx name family addr rest; do echo "addr ${name%%@*} $family $addr"; done
for d in "$root"/class/net/*; do
  [ -d "$d/bridge" ] && echo "bridge ${d##*/}"
  [ -r "$d/mtu" ] && echo "mtu ${d##*/} $(cat "$d/mtu" 2>/dev/null)"
done
for p in "$root"/class/infiniband/*/ports/*; do
  [ -d "$p" ] || continue
  dev=${p%/ports/*}; dev=${dev##*/}; port=${p##*/}
  echo "port $dev $port $(cat "$p/link_layer" 2>/dev/null | tr ' ' _) $(cat "$p/state" 2>/dev/null | tr -d ' ')"
  for t in "$p"/gid_attrs/types/*; do
    [ -f "$t" ] || continue
    i=${t##*/}
    type=$(cat "$t" 2>/dev/null | tr ' ' _) || continue
    [ -n "$type" ] || continue
    echo "gid $dev $port $i $type $(cat "$p/gids/$i" 2>/dev/null) $(cat "$p/gid_attrs/ndevs/$i" 2>/dev/null)"
  done
done
# Each port's active MTU (sysfs has none): ibv_devinfo, bounded (a wedged HCA must not hang the run).
if command -v ibv_devinfo >/dev/null 2>&1; then
  timeout 10 ibv_devinfo 2>/dev/null | awk '$1 == "hca_id:" { d = $2 } $1 == "port:" { p = $2 }
    $1 == "active_mtu:" { print "ibmtu", d, p, $2 }'
fi
