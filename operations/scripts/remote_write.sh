
if [ -L "$f" ]; then
  if [ "$(id -u)" = 0 ]; then f=$(root_link "$f") || exit 1
  else f=$(readlink -f -- "$f") || fail "is a dangling symbolic link"; fi
fi
d=${f%/*}; [ -n "$d" ] || d=/
[ "$(id -u)" != 0 ] || root_safe_dir "$d"
if [ -e "$f" ] && [ ! -f "$f" ]; then fail "is not a regular file"; fi
case $want in
  absent) [ ! -e "$f" ] || fail "appeared after it was read (run again)" ;;
  any) ;;
  *) [ -f "$f" ] && [ "$(sha256sum < "$f" | cut -d' ' -f1)" = "$want" ] || fail "changed after it was read (run again)" ;;
esac
[ -d "$d" ] || mkdir -p -m "$dmode" -- "$d"
t=$(mktemp -- "$d/.trainfleet.XXXXXX") || fail "cannot make a temp file in $d"
trap 'rm -f -- "$t"' EXIT
if [ -n "${TF_DATA:-}" ]; then printf '%s' "$TF_DATA" | base64 -d > "$t"; else base64 -d > "$t"; fi
if [ -e "$f" ]; then
  chmod "$(stat -c %a -- "$f")" "$t"
  if [ "$(id -u)" = 0 ]; then
    chown -h "$(stat -c %u:%g -- "$f")" "$t"
    if command -v chcon >/dev/null 2>&1; then chcon --reference="$f" "$t" 2>/dev/null || true; fi
  fi
else
  chmod "$mode" "$t"
fi
mv -f -- "$t" "$f"
trap - EXIT
