
conf=$1 dev=$2 t=$3
[ -r "$conf" ] && awk '{ print "conf " $0 }' "$conf"
[ -x "$t" ] || t=$(command -v hccn_tool 2>/dev/null) || t=
if [ -n "$t" ] && [ -x "$t" ]; then
  for d in "$dev"/davinci[0-9]*; do
    i=${d##*/davinci}
    case $i in ''|*[!0-9]*) continue ;; esac
    timeout 5 "$t" -i "$i" -ip -g 2>/dev/null | awk -v i="$i" '{ print "tool " i " " $0 }'
  done
fi
exit 0
