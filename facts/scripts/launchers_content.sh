
d=$1 n=$2; shift 2
for f in "$@"; do
  if [ -f "$d/$f" ]; then printf 'file %s regular - ' "$f"; head -c "$n" "$d/$f" | base64 -w0; echo
  else echo "file $f missing -"; fi
done
