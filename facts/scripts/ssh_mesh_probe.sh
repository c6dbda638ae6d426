
parallel=$1; timeout_s=$2; shift 2
d=$(mktemp -d) || exit 1; trap 'rm -rf "$d"' EXIT
# Start after this node in the list, so the N nodes do not all hit the same peer first.
me=$(hostname); n=0; i=0
for peer in "$@"; do i=$((i + 1)); [ "$peer" = "$me" ] && n=$i; done
i=0
for peer in "$@"; do i=$((i + 1)); [ $i -le $n ] && set -- "$@" "$peer"; done
shift $n
echo "probing $#"
probe() {
  out=$(timeout "$timeout_s" ssh -n -o BatchMode=yes -o StrictHostKeyChecking=yes \
        -o ConnectTimeout="$timeout_s" "$1" true 2>&1)
  rc=$?
  if [ $rc -eq 0 ]; then echo "ok $1"; else echo "fail $1 rc=$rc $(echo "$out" | tr '\n' ' ' | cut -c1-200)"; fi
}
i=0
for peer in "$@"; do
  probe "$peer" >>"$d/first" &
  i=$((i + 1))
  if [ $((i % parallel)) -eq 0 ]; then wait; fi
done
wait
# A timeout, or sshd dropping the connection before authentication (its MaxStartups limit,
# when every node probes at once), says nothing about the mesh: such a peer is probed once
# more, alone. A refused key or a host key mismatch is final.
while read -r status peer rest; do
  case "$status $rest" in
    "fail rc=124"*|*kex_exchange_identification*|*"Connection closed"*|*"Connection reset"*) probe "$peer" ;;
    *) echo "$status $peer $rest" ;;
  esac
done <"$d/first"
