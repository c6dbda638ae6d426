
[ -d "$1" ] || exit 0
for f in "$1"/* "$1"/.[!.]* "$1"/healthy/* "$1"/healthy/.[!.]*; do
  [ -f "$f" ] && printf '%s %s %s\n' "$(stat -c %a "$f")" "$(sha256sum < "$f" | cut -d' ' -f1)" "${f#"$1"/}"
done
true
